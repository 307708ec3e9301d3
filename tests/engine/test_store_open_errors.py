"""Client.init on a shared store that cannot be opened: it never raises, it
returns the documented code (-1: cannot be opened, as an unreachable
cluster; -22: an endpoint that cannot be parsed), and it says why once in
the log and in `last_error`: the store's path, the cause and the fix.
Every setup is made for real (tests/support/broken_stores.py)."""

import errno
import logging
import os
import shutil

import pytest
from broken_stores import KINDS, init_in_child, make, shared_base

import aibrix_eic.engine as eic
from aibrix_eic.engine import surface
from aibrix_eic.engine.errors import StoreUnavailable

LOGGER = "aibrix_eic.engine.open_errors"


@pytest.fixture
def base():
    path = shared_base()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def says_path_cause_and_fix(message: str, directory: str) -> bool:
    """StoreUnavailable's form: `shared store PATH: CAUSE; FIX`, PATH in DIR."""
    head, _, fix = message.partition("; ")
    return message.startswith(f"shared store {directory}") and ": " in head and bool(fix.strip())


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_that_cannot_be_opened_is_minus_one_with_path_cause_and_fix(base, kind):
    endpoint, directory = make(kind, base)
    reply = init_in_child(kind, endpoint)
    assert "raised" not in reply, f"Client.init raised instead of returning a code: {reply['raised']}"
    assert reply["code"] == -1, reply
    assert says_path_cause_and_fix(reply["last_error"], directory), reply["last_error"]


@pytest.mark.parametrize(
    ("raised", "cause"),
    [
        (
            StoreUnavailable("/shm/kv", "the map is 8 GiB, this process asked for 1 GiB", "open it with capacity=8GiB"),
            "8 GiB",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "/shm/kv/lock.mdb"),
            "permission denied on /shm/kv/lock.mdb",
        ),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/shm/kv"), "not a directory"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/shm/kv"), "/shm/kv does not exist"),
        (OSError(errno.ENOSPC, "No space left on device", "/shm/kv/data.mdb"), "no space left"),
        (OSError(errno.EROFS, "Read-only file system", "/shm/kv"), "read-only filesystem"),
        (ModuleNotFoundError("No module named 'lmdb'", name="lmdb"), "lmdb"),
    ],
)
def test_each_cause_the_store_can_raise_maps_to_minus_one_and_its_fix(monkeypatch, raised, cause):
    def open_store(endpoint):
        raise raised

    monkeypatch.setattr(surface, "open_store", open_store)
    client = eic.Client()
    assert client.init("x", "kv?dir=/shm", eic.InitOption()) == -1
    assert cause in client.last_error
    assert says_path_cause_and_fix(client.last_error, "/shm/kv"), client.last_error


def test_lmdb_errors_name_the_store_and_what_to_do(monkeypatch):
    lmdb = pytest.importorskip("lmdb")
    for error, cause in [
        (lmdb.InvalidError("/shm/kv: MDB_INVALID: File is not an LMDB file"), "not a store this engine can read"),
        (lmdb.LockError("mdb_txn_begin: Resource temporarily unavailable"), "lock cannot be taken"),
        (lmdb.ReadonlyError("mdb_txn_begin: Permission denied"), "read-only"),
        (lmdb.DiskError("I/O"), "LMDB cannot open it"),
    ]:

        def open_store(endpoint, error=error):
            raise error

        monkeypatch.setattr(surface, "open_store", open_store)
        client = eic.Client()
        assert client.init("x", "kv?dir=/shm", eic.InitOption()) == -1
        assert cause in client.last_error and says_path_cause_and_fix(client.last_error, "/shm/kv")


def test_each_failure_is_logged_once_with_path_cause_and_fix(monkeypatch, caplog):
    problem = StoreUnavailable("/shm/once", "its lock cannot be taken", "give each container its own dir=")

    def open_store(endpoint):
        raise problem

    monkeypatch.setattr(surface, "open_store", open_store)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    for _ in range(5):  # a connector's probe retries every interval
        assert eic.Client().init("x", "once?dir=/shm", eic.InitOption()) == -1
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert str(problem) in warnings[0].getMessage()


def test_a_bug_while_opening_is_minus_one_and_reported_as_a_bug(monkeypatch, caplog):
    def open_store(endpoint):
        raise KeyError("oops")

    monkeypatch.setattr(surface, "open_store", open_store)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    client = eic.Client()
    assert client.init("x", "kv?dir=/shm", eic.InitOption()) == -1
    assert "bug in aibrix-eic" in client.last_error
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None  # the traceback, for the report


def test_an_endpoint_that_cannot_be_parsed_is_minus_22_and_says_which_parameter():
    client = eic.Client()
    assert client.init("x", "kv?capacity=lots", eic.InitOption()) == -22
    assert "capacity" in client.last_error


def test_a_client_that_opened_has_no_last_error():
    client = eic.Client()
    assert client.init("x", "fine", eic.InitOption()) == 0
    assert client.last_error == ""


@pytest.mark.parametrize(
    "code",
    [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.ENOTDIR, errno.ENOENT, errno.ELOOP, errno.EMFILE],
)
def test_one_errno_table_says_the_same_at_open_and_in_the_store(code):
    """open_errors kept a second table that disagreed with the store's own
    (EDQUOT was not a full disk there, EROFS said something else)."""
    from aibrix_eic.engine import open_errors
    from aibrix_eic.engine.shared_files import from_os_error

    error = OSError(code, os.strerror(code), "/shm/kv/data.mdb")
    explained = open_errors.explain("kv?dir=/shm", error)
    assert explained is not None
    assert (explained.cause, explained.fix) == (
        from_os_error("/shm/kv", error).cause,
        from_os_error("/shm/kv", error).fix,
    )
    if code in (errno.ENOSPC, errno.EDQUOT):
        assert "no space left" in explained.cause


def test_no_advice_says_other_pid_namespaces_cannot_share():
    """They can (the store's own OFD locks, tests/engine/test_shared_store_safety.py)."""
    lmdb = pytest.importorskip("lmdb")
    from aibrix_eic.engine import open_errors

    explained = open_errors.explain("kv?dir=/shm", lmdb.LockError("mdb_txn_begin: Resource temporarily unavailable"))
    assert explained is not None and "namespace" not in str(explained)
