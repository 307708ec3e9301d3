"""registry.install_all through AIBrix's real cache manager: every class is
patched once however many threads install at once, and each workaround's
opt-out leaves a manager stock (the flush patch had none before)."""

import threading

from harness import connector_of, send, tokens, write_behind_manager

from aibrix_eic.aibrix_compat import registry, timeouts
from aibrix_eic.engine import get_store

STORE = "installs"


def test_install_all_from_many_threads_patches_each_class_once(monkeypatch, tmp_path):
    from aibrix_kvcache import cache_manager
    from aibrix_kvcache.l1.l1_cache import L1Cache

    cache = write_behind_manager(monkeypatch, tmp_path, STORE)
    try:
        connector = connector_of(cache)
        start = threading.Barrier(8)
        results = []

        def install() -> None:
            start.wait()
            results.append(registry.install_all(connector, environ={}))

        threads = [threading.Thread(target=install) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 8 and all(all(state.on for state in states) for states in results)
        flush = cache_manager.BaseKVCacheManager.flush
        assert flush._aibrix_eic_waits and not getattr(flush.__wrapped__, "_aibrix_eic_waits", False)
        for setter in ("set_on_hot_access_callback", "set_on_put_callback"):
            patched = getattr(L1Cache, setter)
            assert patched._aibrix_eic_batching and not getattr(patched.__wrapped__, "_aibrix_eic_batching", False)
        assert isinstance(cache_manager.asyncio, timeouts._AsyncioWithOrderedTimeouts)
    finally:
        cache.close()


def test_with_the_flush_patch_opted_out_flush_does_not_wait_for_our_writes(monkeypatch, tmp_path):
    monkeypatch.setenv(registry.FLUSH.opt_out, "0")
    cache = write_behind_manager(monkeypatch, tmp_path, STORE)
    store = get_store(STORE)
    try:
        store.faults.latency_s = 0.5
        assert send(cache, tokens(4, 1), 5).is_ok()
        assert cache.flush().is_ok()
        assert connector_of(cache).health()["write_behind_pending"] > 0, "stock AIBrix: flush() returned at once"
    finally:
        store.faults.clear()
        cache.close()
