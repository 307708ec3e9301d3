"""The aibrix_eic.pth line, run by site.py in a fresh interpreter: it routes
backend EIC to us when the package is there, and stays silent when the
package was removed but the .pth file was left behind (pip uninstall of a
broken install, a copied site-packages, a half-deleted venv)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PTH = REPO / "aibrix_eic.pth"


def _run_with_site_dir(site_dir: Path, extra_path: str | None, code: str) -> subprocess.CompletedProcess:
    """A new interpreter without the normal site-packages (-S), which then
    processes `site_dir` the way it processes site-packages at start-up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIBRIX_EIC_")}
    env.pop("PYTHONPATH", None)
    if extra_path:
        env["PYTHONPATH"] = extra_path
    script = f"import site; site.addsitedir({str(site_dir)!r}); {code}"
    return subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=site_dir,  # not the repo: `-c` puts the cwd on sys.path
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pth_left_behind_without_the_package_is_silent(tmp_path):
    shutil.copy(PTH, tmp_path / PTH.name)
    done = _run_with_site_dir(tmp_path, None, "import importlib.util as u; print(u.find_spec('aibrix_eic'))")
    assert done.returncode == 0
    assert done.stdout.strip() == "None"  # the package really is absent
    assert done.stderr == ""


def test_pth_left_behind_with_a_package_stub_is_silent(tmp_path):
    # What an interrupted uninstall can leave: the directory, no modules.
    shutil.copy(PTH, tmp_path / PTH.name)
    (tmp_path / "aibrix_eic" / "__pycache__").mkdir(parents=True)
    done = _run_with_site_dir(tmp_path, None, "print('started')")
    assert done.returncode == 0
    assert done.stdout.strip() == "started"
    assert done.stderr == ""


def test_pth_installs_the_shim_when_the_package_is_there(tmp_path):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    shutil.copy(PTH, site_dir / PTH.name)
    # Only our package on the path (no aibrix_kvcache needed: the shim is lazy).
    packages = tmp_path / "packages"
    shutil.copytree(REPO / "aibrix_eic", packages / "aibrix_eic", ignore=shutil.ignore_patterns("__pycache__"))
    done = _run_with_site_dir(
        site_dir, str(packages), "import sys; from aibrix_eic.plugin import is_installed; print(is_installed())"
    )
    assert done.stderr == ""
    assert done.stdout.strip() == "True"
