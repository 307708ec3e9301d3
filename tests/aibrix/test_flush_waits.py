"""The cache manager's flush() waits for the writes our connector accepted
(aibrix_compat/flush.py), within write_behind_close_timeout_ms. The
cross-process hand-off it exists for is in test_cross_process.py."""

from harness import make_manager, manager_env, send, tokens, use_config

from aibrix_eic.engine import get_store

STORE = "flushwait"


def _manager(monkeypatch, tmp_path, **config):
    manager_env(monkeypatch)
    use_config(monkeypatch, tmp_path, remote_url=f"local://{STORE}", put_mode="write_behind", **config)
    return make_manager()


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
