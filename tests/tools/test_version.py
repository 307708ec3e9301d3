"""The version is written once, in aibrix_eic/__init__.py: the package
metadata reads it from there, and every place that names a build of this
package (a wheel file, an image tag) names that version."""

import os
import re
import tomllib
from importlib.metadata import version

import aibrix_eic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# benchmarks/RESULTS.md records the version each run measured; CHANGELOG.md names every version.
HISTORY = {os.path.join("benchmarks", "RESULTS.md"), "CHANGELOG.md"}
BUILD_NAMES = re.compile(r"aibrix_eic-(\d+\.\d+\.\d+\S*?)-py3|vllm-aibrix-eic:(\d+\.\d+\.\d+)")


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_pyproject_reads_the_version_from_the_package():
    project = _pyproject()
    assert "version" not in project["project"], "a second copy of the version in pyproject.toml"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "aibrix_eic/__init__.py"


def test_the_installed_metadata_has_the_package_version():
    assert version("aibrix-eic") == aibrix_eic.__version__


def _text_files() -> list[str]:
    found = ["README.md", "Makefile"]
    for top in ("docs", "deploy", "scripts", ".ci", "benchmarks"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            found += [os.path.relpath(os.path.join(folder, name), ROOT) for name in files]
    return [f for f in found if f not in HISTORY and os.path.isfile(os.path.join(ROOT, f))]


def test_every_build_named_in_the_repository_has_the_package_version():
    stale = []
    for path in _text_files():
        try:
            with open(os.path.join(ROOT, path), encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        for match in BUILD_NAMES.finditer(text):
            named = match.group(1) or match.group(2)
            if not named.startswith(aibrix_eic.__version__):
                stale.append(f"{path}: {match.group(0)}")
    assert not stale, f"builds named with another version than {aibrix_eic.__version__}: {stale}"


def test_the_check_sees_a_stale_version():
    assert BUILD_NAMES.search("pip install dist/aibrix_eic-0.0.9-py3-none-any.whl").group(1) == "0.0.9"
    assert BUILD_NAMES.search("image: REGISTRY/vllm-aibrix-eic:0.0.9").group(2) == "0.0.9"
