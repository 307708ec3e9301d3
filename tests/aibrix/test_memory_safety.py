"""The connector never touches memory AIBrix released: not after AIBrix's
own timeout fired (aibrix_compat.order_timeouts with request_guard), not on
a region whose last reference is gone, and not under a storm of timeouts.

The races are made deterministic by holding the cache manager's event-loop
thread inside the request's first step, past AIBrix's timeout, the way a
stalled loop does in production."""

import asyncio
import threading

import pytest
from harness import (
    BLOCK_NTOKENS,
    block_layout,
    block_spec,
    connector_of,
    make_manager,
    manager_env,
    send,
    tokens,
    use_config,
)
from harness import stall_next_get as harness_stall_next_get
from poison import PoisonWatch
from waiting import wait_until

from aibrix_eic.aibrix_compat import timeouts as aibrix_compat
from aibrix_eic.engine import get_store

NBLOCKS = 4
STALL_S = 1.0  # loop held this long; AIBrix's timeout is NBLOCKS * 16 * 1 ms = 64 ms


@pytest.fixture(params=["compact", "token-validation"])
def manager(request, monkeypatch, tmp_path):
    with block_layout(compact=request.param == "compact"):
        manager_env(monkeypatch, AIBRIX_KV_CACHE_OL_L2_CACHE_PER_TOKEN_TIMEOUT_MS="1")
        use_config(monkeypatch, tmp_path, remote_url="local://memsafe", batch_keys=2)
        cache = make_manager(block_spec(), max_tokens=NBLOCKS * BLOCK_NTOKENS)
        try:
            yield cache
        finally:
            cache.close()
            get_store("memsafe").clear()


def offload(cache, query, seed: int) -> None:
    assert send(cache, query, seed).is_ok()


def stall_next_get(monkeypatch, cache):
    """The next L2Cache.get holds the loop thread for STALL_S in its first
    step, then runs for real. Returns (regions it was given, its end)."""
    return harness_stall_next_get(monkeypatch, cache, threading.Event(), STALL_S)


def mgets(cache) -> int:
    return connector_of(cache).health()["gets"]


def sdk_calls_done(cache) -> bool:
    """The manager's loop has run what was ready (the late get's tail) and
    no SDK data call of its connector is running or queued."""
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), cache._event_loop).result(timeout=60)
    pool = connector_of(cache).link.data_pool
    return pool.longest_busy_s() == 0 and pool._queue.empty()


def test_a_get_running_after_aibrix_timed_out_never_writes_into_released_memory(manager, monkeypatch):
    watch = PoisonWatch(manager._allocator)
    query = tokens(NBLOCKS, seed=1)
    offload(manager, query, seed=1)
    gets_before = mgets(manager)
    given, ended = stall_next_get(monkeypatch, manager)

    status = manager.acquire(None, query)
    assert status.is_timeout(), status
    assert ended.wait(STALL_S + 5)
    # any SDK call the late coroutine started has landed, and AIBrix freed what it held
    wait_until(
        lambda: sdk_calls_done(manager) and watch.frees >= 2 * NBLOCKS,
        what="the late get's calls landed and its regions freed",
        show=lambda: watch.frees,
    )
    assert len(given) == NBLOCKS and watch.frees >= 2 * NBLOCKS  # the offload's and the acquire's regions
    assert watch.check_all() == []
    assert mgets(manager) == gets_before  # the abandoned request sent nothing
    manager._allocator.assert_consistency()
    assert len(manager._allocator) == 0


def test_a_get_running_after_aibrix_timed_out_never_frees_a_region_twice(manager, monkeypatch):
    query = tokens(NBLOCKS, seed=3)
    offload(manager, query, seed=3)
    _, ended = stall_next_get(monkeypatch, manager)

    assert manager.acquire(None, query).is_timeout()
    assert ended.wait(STALL_S + 5)
    wait_until(
        lambda: sdk_calls_done(manager) and len(manager._allocator) <= 0,
        what="the late get's calls landed and its regions freed",
        show=lambda: len(manager._allocator),
    )
    manager._allocator.assert_consistency()
    assert len(manager._allocator) == 0  # was negative: a double free
    ntokens, handle = manager.acquire(None, query).get()  # and the cache still works
    assert ntokens == NBLOCKS * BLOCK_NTOKENS
    handle.release()


def test_order_timeouts_is_opt_out_and_idempotent(manager, monkeypatch):
    from aibrix_kvcache import cache_manager

    from aibrix_eic.aibrix_compat import registry

    connector = connector_of(manager)
    assert aibrix_compat.order_timeouts(connector) and aibrix_compat.order_timeouts(connector)
    assert isinstance(cache_manager.asyncio, aibrix_compat._AsyncioWithOrderedTimeouts)
    monkeypatch.setattr(cache_manager, "asyncio", aibrix_compat.asyncio)
    for opt_out in ({"AIBRIX_EIC_PATCH_TIMEOUTS": "0"}, {"AIBRIX_EIC_DISABLE_TIMEOUT_ORDERING": "1"}):
        timeouts = registry.install_all(connector, environ=opt_out)[0]
        assert timeouts.workaround is registry.TIMEOUTS and not timeouts.on
        assert cache_manager.asyncio is aibrix_compat.asyncio


def test_a_region_whose_last_reference_is_gone_is_refused_and_not_resurrected(manager):
    connector = connector_of(manager)
    query = tokens(1, seed=4)
    offload(manager, query, seed=4)
    mr = manager.allocate_for(None, query).get().memory_regions[0]
    mr.ref_down()  # AIBrix released it
    assert mr.ref_count == 0
    key = list(manager._l2_cache._cache_block_keys(None, query))[0][1]
    import asyncio

    status = asyncio.run(connector.get(key, mr))
    assert status.is_invalid() and "already released" in str(status.value)
    assert mr.ref_count == 0
    assert connector.write_behind.wait_idle(10)  # the offloaded block's pending write lets go of its region
    manager._allocator.assert_consistency()
    assert len(manager._allocator) == 0
