"""Batched L1 ingestion (aibrix_compat/ingestion.py) through AIBrix's real
BaseKVCacheManager with L1 on and our connector on the embedded engine:
each invariant of the batching, and where it must stay out of the way
(EVICTED, AIBrix's async ingestion, other backends, the opt-out, another
aibrix-kvcache version). The side-by-side model against stock AIBrix is in
test_ingestion_model.py."""

import logging
import threading

import numpy as np
import pytest
from aibrix_kvcache import TokenListView
from aibrix_kvcache.cache_hashable import BlockHashes, KVCacheKey
from aibrix_kvcache.l1.l1_cache import L1Cache
from aibrix_kvcache.l2.key_builders import KeyBuilder
from aibrix_kvcache.memory import MemoryRegion
from harness import BLOCK_NTOKENS, block_spec, connector_of, make_manager, receive, send, tokens, use_config
from hypothesis import given, settings
from hypothesis import strategies as st

from aibrix_eic.aibrix_compat import ingestion
from aibrix_eic.engine import get_store

STORE = "ingest"
L1_BLOCKS = 40


@pytest.fixture
def build(monkeypatch, tmp_path):
    made = []

    def make(ingestion_type="HOT", policy="S3FIFO", inflight=0, backend="EIC", l1_blocks=L1_BLOCKS, **config):
        spec = block_spec()
        env = {
            "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1",
            "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": str(l1_blocks * spec.block_nbytes / 1e9),
            "AIBRIX_KV_CACHE_OL_L1_CACHE_EVICTION_POLICY": policy,
            "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": backend,
            "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE": ingestion_type,
            "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": str(inflight),
            "AIBRIX_KV_CACHE_OL_L2_CACHE_OP_BATCH": "8",
            "AIBRIX_KV_CACHE_OL_MOCK_USE_MPUT_MGET": "1",
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        config.setdefault("put_mode", "direct")  # a put ends when EIC stored it: L2 is final after each call
        use_config(monkeypatch, tmp_path, remote_url=f"local://{STORE}", batch_keys=8, warmup_keys=0, **config)
        cache = make_manager(spec)
        cache.spy = L2Spy(cache)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


class L2Spy:
    """Every L2Cache.put of a manager: its block count and whether every
    region was sealed when it started; and every manager _release of a
    region a put was given before that put ended."""

    def __init__(self, cache, fail: Exception | None = None) -> None:
        self.puts: list[int] = []
        self.unsealed = 0
        self.started: set[int] = set()
        self.ended: set[int] = set()
        self.early_releases = 0
        self.fail = fail
        l2 = cache._l2_cache
        put = l2.put

        async def spied_put(prefix, query, mrs):
            regions = [mrs] if isinstance(mrs, MemoryRegion) else list(mrs)
            self.puts.append(len(regions))
            self.unsealed += sum(1 for mr in regions if not mr.is_sealed)
            self.started.update(id(mr) for mr in regions)
            try:
                if self.fail is not None:
                    raise self.fail
                return await put(prefix, query, mrs)
            finally:
                self.ended.update(id(mr) for mr in regions)

        l2.put = spied_put
        release = cache._release

        def spied_release(values):
            self.early_releases += sum(1 for v in values if id(v) in self.started and id(v) not in self.ended)
            release(values)

        cache._release = spied_release


def hot(cache, query, prefix=None) -> int:
    status = cache.acquire(prefix, query)
    assert status.is_ok(), status
    ntokens, handle = status.get()
    handle.release()
    return ntokens


def wrapped(cache) -> bool:
    """Whether the manager's L1 has batching acquire/put of its own."""
    return "acquire" in vars(cache._l1_cache) or "put" in vars(cache._l1_cache)


def l1_refs(cache) -> list[int]:
    return [mr.ref_count for mr in cache._l1_cache._eviction_policy.values()]


def in_store() -> int:
    return len(get_store(STORE))


@pytest.mark.parametrize("policy", ["S3FIFO", "LRU", "FIFO"])
@pytest.mark.parametrize("ingestion_type", ["HOT", "ALL"])
def test_one_put_per_l1_call_and_every_reference_dropped_once_after_it(build, policy, ingestion_type):
    cache = build(ingestion_type, policy)
    query = tokens(8, seed=1)
    assert send(cache, query, seed=1).is_ok()
    assert hot(cache, query) == 8 * BLOCK_NTOKENS
    assert cache.spy.puts == [8], "one L2Cache.put for the 8 adjacent blocks of the call"
    assert cache.spy.unsealed == 0 and cache.spy.early_releases == 0
    assert in_store() == 8
    assert l1_refs(cache) == [1] * 8, "each block: L1's own reference, the callback's dropped once"
    health = connector_of(cache).health()
    assert (health["ingestion_puts"], health["ingestion_blocks"], health["ingestion_lost"]) == (1, 8, 0)
    cache._l1_cache.delete(None, query)
    assert cache._allocator._used_nbytes == 0
    assert receive(cache, query, seed=1) == (8 * BLOCK_NTOKENS, True), "bit-exact from L2"


def test_chunks_of_one_prompt_each_get_one_put_under_their_own_prefix(build):
    cache = build("HOT")
    prompt = tokens(24, seed=2)
    chunk = 8 * BLOCK_NTOKENS
    for start in range(0, len(prompt), chunk):
        assert send_chunk(cache, prompt, start, chunk, seed=2).is_ok()
    for start in range(0, len(prompt), chunk):
        assert hot(cache, prompt[start : start + chunk], prompt[:start] if start else None) == chunk
    assert cache.spy.puts == [8, 8, 8]
    cache._l1_cache.delete(None, prompt)
    assert receive(cache, prompt, seed=None)[0] == len(prompt), "the chunked puts stored the prompt's keys"


def send_chunk(cache, prompt, start: int, chunk: int, seed: int):
    prefix = prompt[:start] if start else None
    query = prompt[start : start + chunk]
    handle = cache.allocate_for(prefix, query).get()
    return cache.put(prefix, query, handle)


def test_the_start_up_log_says_it_is_batched(build, caplog):
    with caplog.at_level(logging.INFO, logger=ingestion.__name__):
        build("HOT")
    assert ingestion.BATCHED_LOG_LINE in caplog.text and ingestion.OPT_OUT_ENV in caplog.text


def test_opt_out_keeps_aibrix_one_put_per_block(build, monkeypatch):
    monkeypatch.setenv(ingestion.OPT_OUT_ENV, "0")
    cache = build("HOT")
    query = tokens(8, seed=3)
    assert send(cache, query, seed=3).is_ok()
    hot(cache, query)
    assert cache.spy.puts == [1] * 8
    assert not wrapped(cache)
    assert connector_of(cache).health()["ingestion_puts"] == 0


def test_another_aibrix_kvcache_version_is_left_alone(build, monkeypatch):
    from aibrix_eic.aibrix_compat import registry

    monkeypatch.setattr(registry, "aibrix_version", lambda: "0.8.1")
    state = registry.decide(registry.INGESTION)
    assert state.on is False and "0.8.1" in state.why
    cache = build("ALL")
    assert send(cache, tokens(4, seed=4), seed=4).is_ok()
    assert cache.spy.puts == [1] * 4


def test_evicted_ingestion_is_never_deferred(build):
    cache = build("EVICTED", l1_blocks=12)
    policy = cache._l1_cache._eviction_policy
    assert policy._on_evict == cache._l2_ingestion_callback, "the manager's own callback"
    assert not wrapped(cache)
    for i in range(6):  # 24 blocks through an L1 of 12: the allocation retries evict, each eviction writes L2
        assert send(cache, tokens(4, seed=50 + i), seed=50 + i).is_ok()
        assert in_store() == sum(cache.spy.puts), "every evicted block was in L2 when put() returned"
    assert cache.spy.puts and set(cache.spy.puts) == {1}


def test_aibrix_async_ingestion_is_left_alone(build):
    cache = build("ALL", inflight=65536)
    assert cache._l1_cache._eviction_policy._on_put == cache._l2_ingestion_callback
    assert not wrapped(cache)
    assert send(cache, tokens(4, seed=6), seed=6).is_ok()
    cache.flush()
    assert cache.spy.puts == [1] * 4


def test_a_manager_on_another_backend_is_left_alone(build):
    build("HOT")  # ours first: the class-level hook is in place
    mock = build("HOT", backend="MOCK")
    assert mock._l1_cache._eviction_policy._on_hot_access == mock._l2_ingestion_callback
    query = tokens(4, seed=7)
    assert send(mock, query, seed=7).is_ok()
    hot(mock, query)
    assert mock.spy.puts == [1] * 4


@pytest.mark.parametrize("how", ["raises", "engine_fails"])
def test_a_failed_batched_put_loses_entries_is_counted_and_never_raises(build, how):
    cache = build("HOT", retry_attempts=0, breaker_failures=1000)
    query = tokens(8, seed=8)
    assert send(cache, query, seed=8).is_ok()
    if how == "raises":
        cache.spy.fail = RuntimeError("injected")
    else:
        get_store(STORE).faults.fail_rate = 1.0
    assert hot(cache, query) == 8 * BLOCK_NTOKENS, "acquire answers from L1 as if nothing failed"
    get_store(STORE).faults.clear()
    assert in_store() == 0
    assert cache.spy.early_releases == 0 and l1_refs(cache) == [1] * 8
    health = connector_of(cache).health()
    assert (health["ingestion_blocks"], health["ingestion_lost"]) == (8, 8)
    cache._l1_cache.delete(None, query)
    assert cache._allocator._used_nbytes == 0
    assert receive(cache, query)[0] == 0, "a miss, never wrong bytes"


def test_threads_acquiring_at_once_each_send_their_own_blocks(build):
    """The manager is multi-threaded (vLLM's main and kv threads): each
    thread's L1 call collects and sends its own callbacks only."""
    cache = build("HOT", l1_blocks=64)
    queries = [tokens(8, seed=20 + i) for i in range(4)]
    for i, query in enumerate(queries):
        assert send(cache, query, seed=20 + i).is_ok()
    start = threading.Barrier(len(queries))
    errors: list[BaseException] = []

    def reload(query) -> None:
        try:
            start.wait(10)
            assert hot(cache, query) == 8 * BLOCK_NTOKENS
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=reload, args=(query,)) for query in queries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert cache.spy.puts == [8] * 4 and cache.spy.early_releases == 0
    assert l1_refs(cache) == [1] * 32
    for i, query in enumerate(queries):
        cache._l1_cache.delete(None, query)
        assert receive(cache, query, seed=20 + i) == (8 * BLOCK_NTOKENS, True)


def test_a_second_hit_does_not_write_again(build):
    cache = build("HOT")
    query = tokens(8, seed=9)
    assert send(cache, query, seed=9).is_ok()
    hot(cache, query)
    hot(cache, query)
    assert cache.spy.puts == [8]


# ----------------------------------------------------------- grouping
def _keys(prefix_blocks: int, nblocks: int, seed: int, drop: set[int]) -> list[KVCacheKey]:
    """L1's keys for one call (prefix + query sliced as L1Cache does),
    without the blocks in `drop`."""
    prefix = tokens(prefix_blocks, seed=seed) if prefix_blocks else None
    full = tokens(prefix_blocks + nblocks, seed=seed)
    query = full[prefix_blocks * BLOCK_NTOKENS :]
    if prefix is not None:
        prefix = full[: prefix_blocks * BLOCK_NTOKENS]
    keys = list(L1Cache.cache_block_keys(prefix, query, BLOCK_NTOKENS))
    return [KVCacheKey(*k) for i, k in enumerate(keys) if i not in drop]


@settings(max_examples=60, deadline=None)
@given(
    prefix_blocks=st.integers(0, 3),
    nblocks=st.integers(1, 12),
    drop=st.sets(st.integers(0, 11), max_size=6),
    second=st.booleans(),
)
def test_runs_are_adjacent_blocks_of_one_sequence_with_stock_keys(prefix_blocks, nblocks, drop, second):
    keys = _keys(prefix_blocks, nblocks, seed=1, drop=drop)
    if second:  # another call's sequence with the same tokens: a different array, never joined
        keys += _keys(prefix_blocks, nblocks, seed=1, drop=set())
    if not keys:
        return
    pending = [(key, object()) for key in keys]
    runs = ingestion.group_runs(pending)
    builder = KeyBuilder.create("ROLLING_HASH", block_size=BLOCK_NTOKENS)
    stock = [k for key in keys for k in builder.build(key.prefix, key.query)]
    batched = [k for prefix, query, _ in runs for k in builder.build(prefix, query)]
    assert [cache_key for _, cache_key in batched] == [cache_key for _, cache_key in stock]
    assert [mr for _, _, mrs in runs for mr in mrs] == [mr for _, mr in pending], "order and regions kept"
    kept = [i for i in range(nblocks) if i not in drop]
    breaks = sum(1 for a, b in zip(kept, kept[1:]) if b != a + 1)
    expected = (breaks + 1 if kept else 0) + (1 if second else 0)
    assert len(runs) == expected, "one run per maximal span of adjacent blocks"


def test_block_hash_keys_group_only_when_they_chain():
    hashes = [f"h{i}" for i in range(6)]

    def key(i: int) -> KVCacheKey:
        return KVCacheKey(BlockHashes(hashes[:i], BLOCK_NTOKENS), BlockHashes(hashes[i : i + 1], BLOCK_NTOKENS))

    runs = ingestion.group_runs([(key(i), i) for i in (0, 1, 2, 4, 5)])
    assert [(len(prefix._data), list(query._data), mrs) for prefix, query, mrs in runs] == [
        (0, ["h0", "h1", "h2"], [0, 1, 2]),
        (4, ["h4", "h5"], [4, 5]),
    ]


def test_token_views_of_different_arrays_are_not_joined():
    a = TokenListView(np.arange(32, dtype=np.int32))
    b = TokenListView(np.arange(32, dtype=np.int32))
    first = KVCacheKey(a[:0], a[:16])
    other = KVCacheKey(b[:16], b[16:32])  # equal tokens, another array
    assert len(ingestion.group_runs([(first, 1), (other, 2)])) == 2
