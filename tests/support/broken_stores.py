"""Shared stores that cannot be opened, as operators meet them: a file where
DIR should be, a DIR this user cannot write, another user's 0700 DIR, a
damaged data.mdb, no lmdb module. Each is made for real; those about
permissions need a process of another user, so as root they run the code
in a child as `nobody` (root passes every permission check), and as any
other user in a child of the same user.

`setups()` lists them; `make(kind, base)` builds one under `base` and
returns the endpoint and the path the message must name."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

import aibrix_eic

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aibrix_eic.__file__)))
NOBODY = 65534
AS_ROOT = os.geteuid() == 0

KINDS = ("file_at_dir", "not_writable", "foreign_0700", "garbage_data", "no_lmdb")
OTHER_USER_KINDS = ("not_writable", "foreign_0700")


def shared_base() -> str:
    """A directory every user can enter (pytest's tmp_path is root's 0700)."""
    base = tempfile.mkdtemp(prefix="aibrix-eic-broken-")
    os.chmod(base, 0o755)
    return base


def make(kind: str, base: str) -> tuple[str, str]:
    """Build the setup `kind` under `base`: (endpoint, the path to name)."""
    directory = os.path.join(base, kind)
    if kind == "file_at_dir":
        with open(directory, "w") as f:
            f.write("not a directory\n")
    elif kind == "not_writable":
        os.mkdir(directory, 0o500)
        if AS_ROOT:
            os.chown(directory, NOBODY, NOBODY)  # nobody's own DIR, without write permission
    elif kind == "foreign_0700":
        if not AS_ROOT:
            pytest.skip("another user's directory can be made only as root")
        os.makedirs(os.path.join(directory, "kv"))
        os.chmod(directory, 0o700)  # root's: nobody cannot enter it
    elif kind == "garbage_data":
        os.makedirs(os.path.join(directory, "kv"))
        with open(os.path.join(directory, "kv", "data.mdb"), "wb") as f:
            f.write(os.urandom(64 * 1024))  # what a foreign or damaged file looks like
    elif kind != "no_lmdb":
        raise ValueError(kind)
    return f"kv?dir={directory}", directory


INIT = """
    import json, sys
    if sys.argv[2] == "no_lmdb":
        sys.modules["lmdb"] = None  # import lmdb now fails, as where it is not installed
    import aibrix_eic.engine as eic
    client = eic.Client()
    try:
        code = client.init("x", sys.argv[1], eic.InitOption())
        print(json.dumps({"code": code, "last_error": client.last_error}))
    except BaseException as e:
        print(json.dumps({"raised": repr(e)}))
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": REPO_ROOT, "PYTHONDONTWRITEBYTECODE": "1"}


_nobody_reads: dict[str, str] = {}


def _skip_unless_nobody_reads_the_checkout(as_nobody: list[str]) -> None:
    """`nobody` must be able to run this interpreter and import the package
    from the checkout: not so where the checkout or its venv lies under a
    private directory (a clone in `mktemp -d`, 0700). Skip, saying so."""
    if "why" not in _nobody_reads:
        probe = subprocess.run(
            [*as_nobody, sys.executable, "-c", "import aibrix_eic.engine, lmdb"],
            capture_output=True,
            text=True,
            env=child_env(),
            cwd="/",
            timeout=120,
        )
        _nobody_reads["why"] = "" if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["?"])[-1]
    if _nobody_reads["why"]:
        pytest.skip(
            f"user nobody cannot import aibrix_eic from {REPO_ROOT} with {sys.executable} "
            f"({_nobody_reads['why']}): the other-user cases need a checkout and venv other users can read"
        )


def run_child(argv: list[str], other_user: bool, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run argv in a child: as `nobody` when asked and this is root. Through
    setpriv: subprocess's own `user=` cannot exec an interpreter installed
    under root's 0700 home."""
    if other_user and AS_ROOT:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv (util-linux) to run a child as another user")
        as_nobody = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        _skip_unless_nobody_reads_the_checkout(as_nobody)
        argv = [*as_nobody, *argv]
    return subprocess.run(argv, capture_output=True, text=True, env=child_env(), cwd=REPO_ROOT, timeout=timeout)


def init_in_child(kind: str, endpoint: str) -> dict:
    """Client.init on `endpoint` in a child that meets `kind` as an operator would."""
    done = run_child([sys.executable, "-c", textwrap.dedent(INIT), endpoint, kind], other_user=kind in OTHER_USER_KINDS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
