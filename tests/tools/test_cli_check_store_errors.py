"""`aibrix-eic check` on a shared store that cannot be opened: the failure is
the store's, said with its path, cause and fix, with and without -v; never
"internal error ... this is a bug in aibrix-eic", which stays for real bugs.
The setups are made for real (tests/support/broken_stores.py); the two that
need another user run the command in a child of that user."""

import shutil
import sys

import pytest
from broken_stores import KINDS, OTHER_USER_KINDS, make, run_child, shared_base
from harness import write_config

from aibrix_eic.cli import main

BUG = "bug in aibrix-eic"
# A venv whose interpreter links into root's 0700 home runs, as another
# user, on the system's Python 3.11 of the same ABI; redis (which AIBrix
# imports) wants async_timeout there before 3.11.3: asyncio's is the same.
CHECK_IN_CHILD = """
import asyncio, sys, types
try:
    import async_timeout
except ImportError:
    sys.modules["async_timeout"] = types.SimpleNamespace(timeout=asyncio.timeout)
from aibrix_eic.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def base():
    path = shared_base()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def asynchronous_ingestion(monkeypatch):
    monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS", "16384")


def check_output(kind: str, config: str, verbose: bool, capsys, monkeypatch) -> tuple[int, str]:
    args = ["check", "--config", config, *(["-v"] if verbose else [])]
    if kind in OTHER_USER_KINDS:
        done = run_child([sys.executable, "-c", CHECK_IN_CHILD, *args], other_user=True)
        return done.returncode, done.stdout + done.stderr
    if kind == "no_lmdb":
        monkeypatch.setitem(sys.modules, "lmdb", None)  # import lmdb fails, as where it is not installed
        for module in ("aibrix_eic.engine.shared_store", "aibrix_eic.engine.shared_records"):
            monkeypatch.delitem(sys.modules, module, raising=False)
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("verbose", [False, True], ids=["plain", "-v"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_store_that_cannot_be_opened_is_reported_as_the_stores_problem(base, kind, verbose, capsys, monkeypatch):
    endpoint, directory = make(kind, base)
    config = write_config(f"{base}/{kind}.yaml", remote_url=f"local://{endpoint}")
    code, out = check_output(kind, config, verbose, capsys, monkeypatch)
    assert code == 1, out
    assert "internal error" not in out and BUG not in out, out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict:"))
    assert verdict.startswith("verdict: FAIL at sdk: the embedded engine cannot open shared store " + directory), out
    fix = out.splitlines()[out.splitlines().index(verdict) + 1]
    assert fix.strip().startswith("fix: ") and len(fix.strip()) > len("fix: "), out


def test_a_bug_while_opening_the_store_is_still_reported_as_a_bug(capsys, monkeypatch, tmp_path):
    def broken(endpoint):
        raise KeyError("a bug")

    monkeypatch.setattr("aibrix_eic.engine.open_store", broken)
    config = write_config(str(tmp_path / "eic.yaml"), remote_url=f"local://kv?dir={tmp_path}")
    assert main(["check", "--config", config]) == 1
    out = capsys.readouterr().out
    assert "internal error: KeyError" in out and BUG in out


def test_the_connectors_open_says_the_same_as_check(tmp_path):
    """What the connector's open (and so the breaker's reason and its log
    line) says comes from the same place as what check prints."""
    from aibrix_eic.engine import open_errors

    (tmp_path / "file").write_text("")
    endpoint = f"kv?dir={tmp_path}/file"
    problem = open_errors.explain(endpoint, NotADirectoryError(20, "Not a directory", f"{tmp_path}/file/kv"))
    assert problem is not None and problem.path == f"{tmp_path}/file/kv"
    assert problem.cause == f"{tmp_path}/file is not a directory"
