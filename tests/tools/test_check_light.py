"""`aibrix-eic check --config-only` needs PyYAML and this package only: a CI
job that lints a ConfigMap does not install torch or aibrix-kvcache. Proved
in a fresh venv holding nothing else (built once per module: `pip install
pyyaml` and `pip install --no-deps .`), and by the modules the config path
imports in the test venv."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "aibrix_kvcache", "prometheus_client", "numpy", "lmdb")


def _pip(python: str, *args: str) -> None:
    # this venv's pip installs into the light venv (--python): that venv needs no pip of its own
    command = [sys.executable, "-m", "pip", "--python", python, "install", "-qq", "--disable-pip-version-check", *args]
    subprocess.run(command, check=True, timeout=240, cwd=REPO)


@pytest.fixture(scope="module")
def light_python(tmp_path_factory) -> str:
    venv = tmp_path_factory.mktemp("light") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")
    _pip(python, "pyyaml")
    _pip(python, "--no-deps", str(REPO))
    return python


def run_cli(python: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("AIBRIX_EIC_", "AIBRIX_KV_CACHE_OL_EIC"))}
    environ.update(env or {})
    return subprocess.run(
        [python, "-m", "aibrix_eic", *args], capture_output=True, text=True, timeout=60, env=environ, cwd="/"
    )


def test_the_light_venv_has_nothing_but_pyyaml_and_the_package(light_python):
    names = ", ".join(repr(name) for name in HEAVY)
    code = f"import importlib.util as u; print([n for n in ({names},) if u.find_spec(n)])"
    done = subprocess.run([light_python, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("config", ["eic.yaml", "eic-local.yaml"])
def test_config_only_passes_the_example_configs_without_torch(light_python, config):
    done = run_cli(light_python, "check", "--config-only", "--config", str(REPO / "deploy" / config))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: PASS: the config is valid for" in done.stdout
    if config == "eic.yaml":  # eic:// on a host without the vendor SDK
        assert "this host has no vendor EIC SDK (`import eic` fails); the node that runs this config needs it" in (
            done.stdout
        )


def test_config_only_gives_each_problem_as_a_record_without_torch(light_python, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("remote_url: eic://10.0.0.1:12500\neic_instance_id: x\nput_mode: fast\nbogus: 1\n")
    done = run_cli(
        light_python,
        "check",
        "--config-only",
        "--json",
        "--config",
        str(path),
        env={"AIBRIX_EIC_BATCH_KEYS": "many", "AIBRIX_EIC_DISABLE_AUTOLOAD": "1"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    document = json.loads(done.stdout)
    (step,) = document["steps"]
    records = {record["key"]: record for record in step["problems"]}
    assert set(records) == {"put_mode", "bogus", "batch_keys"}
    assert records["put_mode"]["file"] == str(path) and records["put_mode"]["line"] == 3
    assert records["batch_keys"]["variable"] == "AIBRIX_EIC_BATCH_KEYS" and records["batch_keys"]["file"] is None
    assert "an integer" in records["batch_keys"]["fix"]


def test_printed_docs_paths_are_the_installed_pages(light_python, tmp_path):
    """A user with only the wheel is sent to a page that is on their disk."""
    path = tmp_path / "bad.yaml"
    path.write_text("remote_url: local://\nbogus: 1\n")
    done = run_cli(light_python, "check", "--config-only", "--config", str(path))
    assert done.returncode == 1
    named = [word for word in done.stdout.split() if word.endswith("config.md")]
    assert named, done.stdout
    for page in named:
        assert "site-packages/aibrix_eic/docs/" in page and Path(page).is_file(), page


def test_the_config_path_imports_nothing_heavy_in_the_full_venv(tmp_path):
    """In the test venv, where torch and AIBrix are installed: the CLI's
    entry, the config and `check --config-only` leave them unimported."""
    config = tmp_path / "eic.yaml"
    config.write_text("remote_url: local://store?capacity=1GiB\nput_mode: direct\n")
    code = textwrap.dedent(
        f"""
        import contextlib, io, sys
        import aibrix_eic.cli, aibrix_eic.config, aibrix_eic.config.json_schema
        from aibrix_eic.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["check", "--config-only", "--config", {str(config)!r}]) == 0
            assert main(["check", "--config-only", "--json", "--config", {str(config)!r}]) == 0
        print(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})))
        """
    )
    # the .pth hook runs too (it is not disabled): it must stay as light
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
