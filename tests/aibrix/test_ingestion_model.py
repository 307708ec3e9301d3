"""Batched L1 ingestion against stock AIBrix, side by side: two real
BaseKVCacheManagers with L1 on and our connector on the embedded engine,
one built with AIBRIX_EIC_BATCHED_INGESTION=0 (stock AIBrix), one batched,
take the same puts and acquires (over a small L1, so blocks are evicted and
S3FIFO's ghost entries are hit), for each eviction policy and ingestion
type. After every step: the same L2 contents (keys and bytes), the same L1
state (entries, queues, order, hotness), the same allocator usage, the same
acquired tokens and bytes; and the batched manager made exactly one
L2Cache.put per run of adjacent blocks of each L1 call where stock made one
per block (EVICTED: the same puts as stock)."""

import hashlib
import os
import tempfile

import torch
from aibrix_kvcache.l1.eviction_policy.s3fifo import S3FIFO
from aibrix_kvcache.memory import MemoryRegion
from harness import BLOCK_NTOKENS, block_spec, make_manager, pattern, tokens, write_config
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from aibrix_eic.aibrix_compat.ingestion import OPT_OUT_ENV as BATCHED_INGESTION_ENV
from aibrix_eic.config import ENV_CONFIG
from aibrix_eic.engine import get_store

PROMPTS = 3
PROMPT_BLOCKS = 12
L1_BLOCKS = 10  # S3FIFO's small queue holds 3 of them
ENV = (
    "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED",
    "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB",
    "AIBRIX_KV_CACHE_OL_L1_CACHE_EVICTION_POLICY",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_OP_BATCH",
    BATCHED_INGESTION_ENV,
    ENV_CONFIG,
)
_examples = [0]


class PutLog:
    """Per manager: a ("call",) mark when an L1 acquire/put starts, and
    (array id, first token, last token) of every L2Cache.put."""

    def __init__(self, cache) -> None:
        self.entries: list[tuple] = []
        l1, l2 = cache._l1_cache, cache._l2_cache
        for name in ("acquire", "put"):
            setattr(l1, name, self._marked(getattr(l1, name)))
        put = l2.put

        async def logged_put(prefix, query, mrs):
            nblocks = 1 if isinstance(mrs, MemoryRegion) else len(mrs)
            assert len(query) == nblocks * BLOCK_NTOKENS
            self.entries.append((id(query._data), query._start, query._stop))
            return await put(prefix, query, mrs)

        l2.put = logged_put

    def _marked(self, method):
        def call(*args, **kwargs):
            self.entries.append(("call",))
            return method(*args, **kwargs)

        return call

    def take(self) -> list[tuple]:
        entries, self.entries = self.entries, []
        return entries


def merged(entries: list[tuple]) -> list[tuple]:
    """Stock's per-block puts as batched ingestion should send them: within
    one L1 call, adjacent blocks of one array joined."""
    out: list[tuple] = []
    for entry in entries:
        last = out[-1] if out else None
        if len(entry) == 3 and last is not None and len(last) == 3 and last[0] == entry[0] and last[2] == entry[1]:
            out[-1] = (last[0], last[1], entry[2])
        else:
            out.append(entry)
    return out


def l1_state(cache) -> list:
    """Every L1 entry in queue order, with its hotness and queue."""
    policy = cache._l1_cache._eviction_policy
    if isinstance(policy, S3FIFO):
        queues = [("small", policy._small_fifo), ("main", policy._main_fifo), ("ghost", policy._ghost_fifo)]
    else:
        queues = [("list", policy)]
    state = []
    for name, queue in queues:
        node = queue._head
        while node is not None:
            key = node.key
            state.append((name, len(key.prefix), key.query.to_numpy().tobytes(), node.hotness, node.value is not None))
            node = node.next
    return state


def l2_contents(store) -> dict:
    with store._lock:
        return {
            key: hashlib.sha1(value.buf[: value.nbytes].tobytes()).hexdigest() for key, value in store._index.items()
        }


class StockVsBatched(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.caches: dict = {}
        self.saved = {name: os.environ.get(name) for name in ENV}
        self.directory = tempfile.TemporaryDirectory()
        self.prompts = [tokens(PROMPT_BLOCKS, seed=900 + i) for i in range(PROMPTS)]

    @initialize(
        policy=st.sampled_from(["S3FIFO", "LRU", "FIFO"]),
        ingestion=st.sampled_from(["HOT", "ALL", "EVICTED"]),
        put_mode=st.sampled_from(["direct", "write_behind"]),
    )
    def build(self, policy: str, ingestion: str, put_mode: str) -> None:
        self.ingestion = ingestion
        spec = block_spec()
        os.environ.update(
            {
                "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1",
                "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": str(L1_BLOCKS * spec.block_nbytes / 1e9),
                "AIBRIX_KV_CACHE_OL_L1_CACHE_EVICTION_POLICY": policy,
                "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
                "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE": ingestion,
                "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": "0",
                "AIBRIX_KV_CACHE_OL_L2_CACHE_OP_BATCH": "4",
            }
        )
        _examples[0] += 1
        for who, flag in (("stock", "0"), ("batched", "1")):
            store = f"model{_examples[0]}{who}"
            os.environ[BATCHED_INGESTION_ENV] = flag
            os.environ[ENV_CONFIG] = write_config(
                os.path.join(self.directory.name, f"{who}.yaml"),
                remote_url=f"local://{store}",
                put_mode=put_mode,  # direct: L2 is final when each call returns; write_behind: once idle
                batch_keys=4,
                warmup_keys=0,
                model_id="model",
            )
            cache = make_manager(spec, max_tokens=PROMPT_BLOCKS * BLOCK_NTOKENS)
            batching = "acquire" in vars(cache._l1_cache)  # ingestion.py's own acquire/put on this L1
            assert batching == (who == "batched" and ingestion != "EVICTED")
            cache.log = PutLog(cache)
            cache.store = get_store(store)
            self.caches[who] = cache

    def _span(self, prompt: int, start: int, nblocks: int):
        whole = self.prompts[prompt]
        start = min(start, PROMPT_BLOCKS - 1)
        nblocks = min(nblocks, PROMPT_BLOCKS - start)
        prefix = whole[: start * BLOCK_NTOKENS] if start else None
        return prefix, whole[start * BLOCK_NTOKENS : (start + nblocks) * BLOCK_NTOKENS], start

    @rule(prompt=st.integers(0, PROMPTS - 1), start=st.integers(0, PROMPT_BLOCKS - 1), nblocks=st.integers(1, 8))
    def put(self, prompt: int, start: int, nblocks: int) -> None:
        prefix, query, first = self._span(prompt, start, nblocks)
        results = []
        for cache in self.caches.values():
            status = cache.allocate_for(prefix, query)
            if not status.is_ok():
                results.append(("allocate", status.error_code))
                continue
            handle = status.get()
            nbytes = cache.block_spec.block_nbytes
            for i, tensor in enumerate(handle.to_tensors()):
                tensor.view(torch.uint8).view(-1).copy_(pattern(prompt, first + i, nbytes))
            put = cache.put(prefix, query, handle)
            results.append((put.error_code, put.value if put.is_ok() else None))
        assert results[0] == results[1]

    @rule(prompt=st.integers(0, PROMPTS - 1), start=st.integers(0, PROMPT_BLOCKS - 1), nblocks=st.integers(1, 12))
    def acquire(self, prompt: int, start: int, nblocks: int) -> None:
        prefix, query, first = self._span(prompt, start, nblocks)
        results = []
        for cache in self.caches.values():
            status = cache.acquire(prefix, query)
            if not status.is_ok():
                results.append((status.error_code, None))
                continue
            ntokens, handle = status.get()
            nbytes = cache.block_spec.block_nbytes
            data = [tensor.view(torch.uint8).view(-1).clone() for tensor in handle.to_tensors()]
            handle.release()
            for i, got in enumerate(data):
                assert torch.equal(got, pattern(prompt, first + i, nbytes)), f"block {first + i} of prompt {prompt}"
            results.append((ntokens, [hashlib.sha1(d.numpy().tobytes()).hexdigest() for d in data]))
        assert results[0] == results[1]

    @invariant()
    def same_as_stock(self) -> None:
        if not self.caches:
            return
        stock, batched = self.caches["stock"], self.caches["batched"]
        for cache in (stock, batched):
            assert cache._l2_cache._backend.write_behind.wait_idle(10)
        assert l2_contents(stock.store) == l2_contents(batched.store), "L2 contents differ"
        assert l1_state(stock) == l1_state(batched), "L1 state differs"
        assert stock._allocator._used_nbytes == batched._allocator._used_nbytes, "allocator usage differs"
        stock_puts, batched_puts = stock.log.take(), batched.log.take()
        expected = stock_puts if self.ingestion == "EVICTED" else merged(stock_puts)
        assert batched_puts == expected, "not one L2Cache.put per run of adjacent blocks per L1 call"

    def teardown(self) -> None:
        for cache in self.caches.values():
            cache.close()
            cache.store.clear()
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self.directory.cleanup()


StockVsBatched.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
TestStockVsBatched = StockVsBatched.TestCase
