"""Write-behind through AIBrix's real BaseKVCacheManager with L1 on: the
configuration most deployments run, where L2 gets its blocks from L1's
ingestion callback (one put per run of adjacent blocks of an L1 call, with
aibrix_compat/ingestion.py; one per block with async ingestion). Every test runs with ingestion ALL and HOT, with
synchronous and asynchronous L2 writes, and watches the allocator for bytes
landing in released memory."""

import asyncio
import time

import pytest
import torch
from harness import (
    BLOCK_NTOKENS,
    block_spec,
    connector_of,
    make_manager,
    pattern,
    receive,
    send,
    tokens,
    use_config,
    watch_peak_counted_bytes,
)
from poison import PoisonWatch

from aibrix_eic.engine import get_store

STORE = "wbm"
L1_BLOCKS = 40  # the L1 capacity, in blocks (S3FIFO's small queue holds 30 % of it)


@pytest.fixture(
    params=[("ALL", 0), ("ALL", 65536), ("HOT", 0), ("HOT", 65536)],
    ids=lambda p: f"{p[0]}-{'async' if p[1] else 'sync'}",
)
def mode(request):
    return request.param


@pytest.fixture
def build(mode, monkeypatch, tmp_path):
    ingestion, inflight = mode
    made = []

    def make(**config):
        spec = block_spec()
        env = {
            "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1",
            "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": str(L1_BLOCKS * spec.block_nbytes / 1e9),
            "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
            "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE": ingestion,
            "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": str(inflight),
            "AIBRIX_KV_CACHE_OL_L2_CACHE_OP_BATCH": "8",
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        config.setdefault("put_mode", "write_behind")
        use_config(monkeypatch, tmp_path, remote_url=f"local://{STORE}", batch_keys=8, **config)
        cache = make_manager(spec)
        cache.watch = PoisonWatch(cache._allocator)
        cache.ingestion = ingestion
        made.append(cache)
        return cache

    yield make
    for cache in made:
        violations = cache.watch.check_all()
        cache.close()
        assert not violations, violations


def offload(cache, query, seed: int) -> None:
    assert send(cache, query, seed).is_ok()
    if cache.ingestion == "HOT":  # a block reaches L2 when it is read again from L1
        status = cache.acquire(None, query)
        assert status.is_ok()
        status.get()[1].release()
    wait_for_aibrix_inflight(cache)  # async ingestion: AIBrix's own in-flight writes (ours return at once)


def wait_for_aibrix_inflight(cache) -> None:
    """What AIBrix's flush() waits for, without ours (aibrix_compat/flush.py
    makes flush() wait for the connector's accepted writes too, and these
    tests need them still pending)."""
    if cache._infight_cv is None:
        return
    with cache._infight_cv:
        while cache._l2_inflight_writes > 0:
            cache._infight_cv.wait(1.0)


def offload_chunk(cache, prompt, start: int, ntokens: int, seed: int) -> None:
    """One chunk of a prompt offloaded under its prefix, as Type1 sends it."""
    prefix = prompt[:start] if start else None
    query = prompt[start : start + ntokens]
    handle = cache.allocate_for(prefix, query).get()
    nbytes = cache.block_spec.block_nbytes
    for i, tensor in enumerate(handle.to_tensors()):
        tensor.view(torch.uint8).view(-1).copy_(pattern(seed, start // BLOCK_NTOKENS + i, nbytes))
    assert cache.put(prefix, query, handle).is_ok()
    if cache.ingestion == "HOT":
        status = cache.acquire(prefix, query)
        assert status.is_ok()
        status.get()[1].release()


def reload(cache, query, seed: int) -> tuple[int, bool]:
    return receive(cache, query, seed)


def evict_from_l1(cache, seed: int) -> None:
    """Offload fillers until whatever was in L1 before is gone. S3FIFO keeps
    blocks read since their put in its main queue, so with HOT ingestion the
    fillers are read once too: only then do they push out older hot blocks."""
    for i in range(16):  # 64 blocks, 4 at a time: each filler fits the small queue
        query = tokens(4, seed=seed * 100 + i)
        handle = cache.allocate_for(None, query).get()
        assert cache.put(None, query, handle).is_ok()
        if cache.ingestion == "HOT":
            status = cache.acquire(None, query)
            assert status.is_ok()
            status.get()[1].release()


def from_l2(cache, query, seed: int) -> tuple[int, bool]:
    """Reload, and check the blocks really came from L2 (EIC or pending)."""
    before = connector_of(cache).health()
    result = reload(cache, query, seed)
    after = connector_of(cache).health()
    read = (after["get_blocks"] - before["get_blocks"]) + (after["write_behind_served"] - before["write_behind_served"])
    assert read > 0, "the reload was served by L1: the test evicted nothing"
    return result


def run_on_manager_loop(cache, coro):
    return asyncio.run_coroutine_threadsafe(coro, cache._event_loop).result(timeout=30)


def test_reload_after_eviction_from_l1_is_bit_exact(build):
    cache = build()
    query = tokens(8, seed=1)
    offload(cache, query, seed=1)
    assert connector_of(cache).write_behind.wait_idle(10)
    evict_from_l1(cache, seed=1)
    assert from_l2(cache, query, seed=1) == (8 * BLOCK_NTOKENS, True)


def test_read_your_writes_before_the_flush(build):
    cache = build()
    get_store(STORE).faults.latency_s = 1.0
    query = tokens(8, seed=2)
    offload(cache, query, seed=2)
    evict_from_l1(cache, seed=2)
    assert connector_of(cache).health()["write_behind_pending"] > 0, "nothing pending: the test proves nothing"
    started = time.perf_counter()
    assert from_l2(cache, query, seed=2) == (8 * BLOCK_NTOKENS, True)
    assert connector_of(cache).health()["write_behind_served"] >= 1
    assert time.perf_counter() - started < 0.5, "served from the held regions, not after the flush"
    get_store(STORE).faults.clear()


def test_delete_racing_a_pending_write(build):
    cache = build()
    store = get_store(STORE)
    store.faults.latency_s = 0.05
    query = tokens(8, seed=3)
    offload(cache, query, seed=3)
    assert cache.delete(None, query).is_ok()  # L1, then L2: drops queued writes, waits for the one in flight
    assert cache.exists(None, query).is_not_found()
    assert reload(cache, query, seed=3)[0] == 0
    assert connector_of(cache).write_behind.wait_idle(10)
    keys = {key for _, key in cache._l2_cache._cache_block_keys(None, query)}
    encoded = set(connector_of(cache)._codec.encode_many(list(keys)))
    assert not encoded & {key for _, key in store.keys()}, "a deleted block came back from a pending write"


def test_an_overwrite_is_never_reordered_behind_an_older_write(build):
    cache = build()
    store = get_store(STORE)
    store.faults.latency_s = 0.02
    query = tokens(4, seed=4)
    l2 = cache._l2_cache
    for version in range(5):
        mrs = cache.allocate_for(None, query).get().memory_regions
        for i, mr in enumerate(mrs):
            mr.to_tensor()[: cache.block_spec.block_nbytes].copy_(
                pattern(40 + version, i, cache.block_spec.block_nbytes)
            )
        assert run_on_manager_loop(cache, l2.put(None, query, list(mrs))).is_ok()
        for mr in mrs:
            mr.ref_down()
    assert connector_of(cache).write_behind.wait_idle(10)
    store.faults.clear()
    assert reload(cache, query, seed=44) == (4 * BLOCK_NTOKENS, True)  # L1 never had it: from EIC


def test_close_with_pending_writes_flushes_and_releases(build):
    cache = build()
    store = get_store(STORE)
    store.faults.latency_s = 0.02
    offload(cache, tokens(8, seed=5), seed=5)
    connector = connector_of(cache)
    assert connector.health()["write_behind_pending"] > 0
    started = time.perf_counter()
    assert connector.close().is_ok()
    assert time.perf_counter() - started < 2.0
    assert connector.health()["write_behind_pending"] == 0 and connector.health()["write_behind_lost"] == 0
    assert len(store) >= 8


def test_pending_bytes_stay_within_the_byte_bound(build):
    block = block_spec().block_nbytes
    cache = build(write_behind_max_bytes=3 * block)
    get_store(STORE).faults.latency_s = 0.01
    table = connector_of(cache).write_behind.table
    peak = watch_peak_counted_bytes(table)
    query = tokens(12, seed=6)
    # L1's ingestion of one call reaches L2 as one put (aibrix_compat/ingestion.py),
    # so the prompt goes in chunks of 2 blocks, as Type1 sends chunks: a chunk
    # fits under the bound, two pending do not.
    for start in range(0, len(query), 2 * BLOCK_NTOKENS):
        offload_chunk(cache, query, start, 2 * BLOCK_NTOKENS, seed=6)
    cache.flush()
    assert connector_of(cache).write_behind.wait_idle(10)
    assert 0 < peak[0] <= 3 * block
    assert connector_of(cache).health()["write_behind_waits"] > 0, "no put went past the bound"
    evict_from_l1(cache, seed=6)
    assert from_l2(cache, query, seed=6) == (12 * BLOCK_NTOKENS, True)


def test_nothing_is_queued_while_the_breaker_is_open(build):
    cache = build(probe_interval_s=3600)
    connector = connector_of(cache)
    connector.breaker.trip("test")
    query = tokens(8, seed=7)
    offload(cache, query, seed=7)
    assert connector.health()["write_behind_pending"] == 0 and connector.health()["write_behind_blocks"] == 0
    connector.breaker.reset()
    evict_from_l1(cache, seed=7)
    assert connector_of(cache).write_behind.wait_idle(10)
    assert reload(cache, query, seed=7)[0] == 0


def test_engine_faults_during_flushes_give_misses_never_wrong_bytes(build):
    cache = build(retry_attempts=2, retry_backoff_ms=1, retry_backoff_max_ms=2, breaker_failures=1000)
    store = get_store(STORE)
    store.faults.key_fail_rate = 0.4
    queries = [tokens(6, seed=80 + i) for i in range(4)]
    for i, query in enumerate(queries):
        offload(cache, query, seed=80 + i)
    assert connector_of(cache).write_behind.wait_idle(10)
    store.faults.clear()
    evict_from_l1(cache, seed=8)
    loaded = 0
    for i, query in enumerate(queries):
        ntokens, exact = reload(cache, query, seed=80 + i)
        assert exact, "a reload after failed flushes returned wrong bytes"
        loaded += ntokens
    health = connector_of(cache).health()
    assert health["retries"] > 0
    assert loaded > 0
