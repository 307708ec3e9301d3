"""The cache manager's flush() waits for the writes our connector accepted
(aibrix_compat/flush.py), within write_behind_close_timeout_ms. The
cross-process hand-off it exists for is in test_cross_process.py."""

from harness import send, tokens, write_behind_manager

from aibrix_eic.engine import get_store

STORE = "flushwait"


def _manager(monkeypatch, tmp_path, **config):
    return write_behind_manager(monkeypatch, tmp_path, STORE, **config)


def test_flush_returns_once_the_accepted_writes_are_stored(monkeypatch, tmp_path):
    cache = _manager(monkeypatch, tmp_path)
    store = get_store(STORE)
    try:
        store.faults.latency_s = 0.3
        assert send(cache, tokens(4, 1), 5).is_ok()
        assert cache._l2_cache._backend.health()["write_behind_pending"] > 0
        assert cache.flush().is_ok()
        assert cache._l2_cache._backend.health()["write_behind_pending"] == 0
    finally:
        store.faults.clear()
        cache.close()


def test_flush_says_timeout_when_writes_outlive_the_close_timeout(monkeypatch, tmp_path):
    cache = _manager(monkeypatch, tmp_path, write_behind_close_timeout_ms=100)
    store = get_store(STORE)
    try:
        store.faults.latency_s = 2.0
        assert send(cache, tokens(4, 2), 6).is_ok()
        status = cache.flush()
        assert status.is_timeout(), status
    finally:
        store.faults.clear()
        cache.close()
