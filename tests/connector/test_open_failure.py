"""open() is all or nothing: when it returns anything but OK the connector is
closed, no thread it started is left running, and a second open() on the
same bad state does not pretend to succeed."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from waiting import wait_until

from aibrix_eic.config import EICConfig
from aibrix_eic.connector import EICConnector

THREAD_PREFIX = "aibrix_eic"


def our_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith(THREAD_PREFIX)}


def threads_left(before: set[threading.Thread]) -> list[str]:
    """Threads started since `before` that are still alive."""
    return sorted(thread.name for thread in our_threads() - before if thread.is_alive())


def wait_threads_gone(before: set[threading.Thread], what: str = "the threads open() started to end") -> None:
    wait_until(lambda: not threads_left(before), what=what, show=lambda: threads_left(before))


def refuse_to_start(monkeypatch, name_prefix: str) -> None:
    """Thread.start fails for threads named name_prefix*, as it does when the
    process is out of threads ("can't start new thread")."""
    original = threading.Thread.start

    def start(self):
        if self.name.startswith(name_prefix):
            raise RuntimeError("can't start new thread")
        return original(self)

    monkeypatch.setattr(threading.Thread, "start", start)


def assert_all_or_nothing(conn: EICConnector, before: set[threading.Thread]) -> bool:
    """The invariant; True when open() failed (so the caller checks the retry)."""
    status = conn.open()
    if status.is_ok():
        assert conn.is_open
        return False
    assert not conn.is_open, f"open() returned {status} but the connector says it is open"
    wait_threads_gone(before, f"the threads to end after open() returned {status}")
    assert not conn.open().is_ok(), "a second open() on the same bad state returned OK"
    assert not conn.is_open
    return True


def test_warm_up_that_raises_does_not_leave_the_connector_half_open():
    # Built directly, so the config skips the load-time bound on
    # warmup_timeout_ms: 1e13 ms is past threading.TIMEOUT_MAX.
    config = EICConfig(remote_url="local://half-open", warmup_keys=4, warmup_timeout_ms=1e13)
    conn = EICConnector(config, "half-open", ThreadPoolExecutor(1))
    before = our_threads()
    try:
        assert_all_or_nothing(conn, before)
    finally:
        conn.close()
    wait_threads_gone(before)


@pytest.mark.parametrize("thread_name", ["aibrix_eic_probe", "aibrix_eic_data_2", "aibrix_eic_meta_1"])
def test_a_thread_that_cannot_start_fails_open_cleanly_and_open_works_once_it_can(monkeypatch, thread_name):
    config = EICConfig.from_mapping(
        {"remote_url": "local://half-open", "warmup_keys": 0, "eic_thread_num": 4}, source="<test>"
    )
    conn = EICConnector(config, "half-open", ThreadPoolExecutor(1))
    before = our_threads()
    try:
        with monkeypatch.context() as patch:
            refuse_to_start(patch, thread_name)
            assert assert_all_or_nothing(conn, before), "open() returned OK without a thread it needs"
        assert conn.open().is_ok()
        assert conn.is_open
    finally:
        conn.close()
    wait_threads_gone(before)


def test_a_shared_store_that_cannot_be_opened_is_named_in_the_open_failure_and_logged_rate_limited(
    monkeypatch, tmp_path, caplog
):
    """The connector says what the engine says (path, cause, fix) in its open
    failure, its breaker's reason and its log; the probe's retries every
    interval add no log line per retry."""
    import logging

    from aibrix_eic.engine import surface

    (tmp_path / "file").write_text("in the way")
    remote_url = f"local://kv?dir={tmp_path}/file"
    expected = f"shared store {tmp_path}/file: not a directory; dir= must name a directory"
    inits = {"count": 0}
    retried = threading.Event()
    original = surface.Client.init

    def counting_init(self, *args):
        inits["count"] += 1
        if inits["count"] >= 6:
            retried.set()
        return original(self, *args)

    monkeypatch.setattr(surface.Client, "init", counting_init)
    caplog.set_level(logging.DEBUG, logger="aibrix_eic")

    strict = EICConnector(
        EICConfig.from_mapping({"remote_url": remote_url, "fail_open": False}, source="<test>"), "strict"
    )
    status = strict.open()
    assert not status.is_ok() and expected in str(status.value)

    config = EICConfig.from_mapping({"remote_url": remote_url, "probe_interval_s": 0.01}, source="<test>")
    conn = EICConnector(config, "lenient", ThreadPoolExecutor(1))
    try:
        assert conn.open().is_ok()  # fail_open: the breaker starts open and a probe retries
        assert expected in conn.health()["breaker_reason"]
        assert retried.wait(60), "the probe did not retry the open"
    finally:
        conn.close()
    said = [r for r in caplog.records if expected in r.getMessage() and r.levelno >= logging.INFO]
    # Once by the engine, once by the breaker opening, at most once by the probe's rate-limited line.
    assert 1 <= len(said) <= 4, [f"{r.name} {r.levelname} {r.getMessage()[:80]}" for r in said]
    assert any(r.name == "aibrix_eic.link.link" and r.levelno == logging.WARNING for r in said)


@pytest.mark.parametrize(
    ("remote_url", "timeouts", "endpoint"),
    [
        ("local://kv?dir=/d", {}, "kv?dir=/d&lock_timeout=500ms"),  # exists_timeout_ms, the shortest default
        ("local://kv?dir=/d", {"exists_timeout_ms": 900, "get_timeout_ms": 750}, "kv?dir=/d&lock_timeout=750ms"),
        ("local://kv?dir=/d&lock_timeout=3s", {}, "kv?dir=/d&lock_timeout=3s"),  # the URL's own wins
        ("local://kv", {}, "kv"),  # in-process: no lock to wait for
    ],
)
def test_the_shared_store_learns_the_connectors_deadline_at_init(remote_url, timeouts, endpoint):
    """The SDK's calls carry no deadline, so a shared store's lock waits are
    bounded by the shortest per-call timeout, passed once at init: a call
    that cannot get its lock returns before the request gives up on it."""
    from aibrix_eic.link.sdk import init_endpoint

    assert init_endpoint(EICConfig.from_mapping({"remote_url": remote_url, **timeouts})) == endpoint
