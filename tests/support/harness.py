"""Builders for AIBrix objects in tests: block specs, L2Cache, cache managers,
memory regions with recognisable contents."""

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import yaml
from aibrix_kvcache import BaseKVCacheManager, KVCacheConfig, TokenListView
from aibrix_kvcache.l2.key_builders import KeyBuilder
from aibrix_kvcache.l2.l2_cache import L2Cache
from aibrix_kvcache.memory import ManagedMemoryRegion, TensorPoolAllocator
from aibrix_kvcache.memory import memory_region as _memory_region
from aibrix_kvcache.spec import KVCacheBlockLayout, KVCacheBlockSpec, KVCacheTensorSpec, ModelSpec

from aibrix_eic.config import ENV_CONFIG

BLOCK_NTOKENS = 16


def block_spec(heads: int = 2, layers: int = 2, head_size: int = 64, first_head: int = 0) -> KVCacheBlockSpec:
    """A small LCND bf16 spec: 16 tokens x 2 x layers x heads x head_size x 2 B.
    `first_head` places it as a TP rank's slice of the heads."""
    return KVCacheBlockSpec(
        block_ntokens=BLOCK_NTOKENS,
        block_dtype=torch.bfloat16,
        block_layout=KVCacheBlockLayout.LCND,
        tensor_spec=KVCacheTensorSpec(
            heads=list(range(first_head, first_head + heads)), layers=list(range(layers)), head_size=head_size
        ),
    )


@contextlib.contextmanager
def block_layout(compact: bool) -> Iterator[None]:
    """Switch AIBrix between the compact layout and the token-validation
    layout (block + magic + footer + tokens). AIBrix reads this at import,
    so tests flip the module global it caches."""
    saved = _memory_region.MR_USE_COMPACT_LAYOUT
    _memory_region.MR_USE_COMPACT_LAYOUT = compact
    try:
        yield
    finally:
        _memory_region.MR_USE_COMPACT_LAYOUT = saved


def write_config(path: str, **values) -> str:
    with open(path, "w", encoding="utf-8") as fout:
        yaml.safe_dump(values, fout)
    return path


def use_config(monkeypatch, tmp_path, **values) -> str:
    """Write a YAML config and point the env var at it."""
    values.setdefault("remote_url", "local://")
    path = write_config(os.path.join(str(tmp_path), "eic.yaml"), **values)
    monkeypatch.setenv(ENV_CONFIG, path)
    return path


def tokens(nblocks: int, seed: int = 0) -> TokenListView:
    rng = np.random.default_rng(seed)
    return TokenListView(rng.integers(0, 32000, size=nblocks * BLOCK_NTOKENS, dtype=np.int32))


def pattern(seed: int, block_index: int, nbytes: int) -> torch.Tensor:
    """Bytes unique to (seed, block_index): a wrong block never matches."""
    rng = np.random.default_rng([seed, block_index])
    return torch.from_numpy(rng.integers(0, 256, size=nbytes, dtype=np.uint8))


class L2Harness:
    """An opened L2Cache on backend EIC plus an allocator for its blocks."""

    def __init__(self, spec: KVCacheBlockSpec | None = None, op_batch: int = 8, capacity: int = 64 << 20):
        self.spec = spec or block_spec()
        self.executor = ThreadPoolExecutor(8)
        # ROLLING_HASH is the cache manager's default: 16-byte keys.
        key_builder = KeyBuilder.create("ROLLING_HASH", block_size=self.spec.block_ntokens)
        self.cache = L2Cache(
            "EIC", "SIMPLE", "aibrix", self.spec, self.executor, op_batch=op_batch, key_builder=key_builder
        )
        status = self.cache.open()
        assert status.is_ok(), status
        self.allocator = TensorPoolAllocator.create(capacity_nbytes=capacity)
        self.loop = asyncio.new_event_loop()

    @property
    def connector(self):
        return self.cache._backend

    @property
    def block_nbytes(self) -> int:
        return self.spec.block_nbytes

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def blocks(self, nblocks: int, prefix_blocks: int = 0) -> list[ManagedMemoryRegion]:
        """MRs sized for blocks prefix_blocks .. prefix_blocks+nblocks-1 of a
        sequence (the token-validation layout stores the tokens too)."""
        if _memory_region.MR_USE_COMPACT_LAYOUT:
            sizes = [self.block_nbytes] * nblocks
        else:
            sizes = [
                ManagedMemoryRegion.calculate_size(self.block_nbytes, (prefix_blocks + i + 1) * BLOCK_NTOKENS)
                for i in range(nblocks)
            ]
        mrs = self.allocator.alloc(sizes).get()
        assert len(mrs) == nblocks
        for mr in mrs:
            mr.block_nbytes = self.block_nbytes
        return list(mrs)

    def filled_blocks(self, seed: int, nblocks: int) -> list[ManagedMemoryRegion]:
        mrs = self.blocks(nblocks)
        for i, mr in enumerate(mrs):
            mr.to_tensor()[: self.block_nbytes].copy_(pattern(seed, i, self.block_nbytes))
        return mrs

    def put(self, query: TokenListView, mrs: Sequence[ManagedMemoryRegion], prefix=None):
        return self.run(self.cache.put(prefix, query, list(mrs)))

    def get(self, query: TokenListView, prefix=None, prefix_blocks: int = 0):
        mrs = self.blocks(len(query) // BLOCK_NTOKENS, prefix_blocks)
        status = self.run(self.cache.get(prefix, query, mrs))
        return status, mrs

    def exists(self, query: TokenListView, prefix=None):
        return self.run(self.cache.exists(prefix, query))

    def delete_block(self, query: TokenListView, block_index: int):
        key = list(self.cache._cache_block_keys(None, query))[block_index][1]
        return self.run(self.connector.delete(key))

    def matches(self, mr: ManagedMemoryRegion, seed: int, block_index: int) -> bool:
        data = mr.to_tensor()[: self.block_nbytes]
        return bool(torch.equal(data, pattern(seed, block_index, self.block_nbytes)))

    @staticmethod
    def release(mrs: Sequence[ManagedMemoryRegion]) -> None:
        for mr in mrs:
            mr.ref_down()

    def wait_flushed(self, timeout: float = 10.0) -> None:
        """Wait until every accepted put reached EIC (write-behind returns
        before it does), for tests that look at the store or the SDK calls."""
        assert self.connector.write_behind.wait_idle(timeout), f"write-behind did not flush within {timeout} s"

    def close(self) -> None:
        self.cache.close()
        self.loop.close()
        self.executor.shutdown(wait=False)


def manager_env(monkeypatch, **extra: str) -> None:
    """Environment for a BaseKVCacheManager with only L2 on backend EIC."""
    env = {
        "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "0",
        "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
        "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": "0",
        "AIBRIX_KV_CACHE_OL_L2_CACHE_OP_BATCH": "8",
        **extra,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def make_manager(spec: KVCacheBlockSpec | None = None, max_tokens: int = 2048) -> BaseKVCacheManager:
    config = KVCacheConfig(
        block_spec=spec or block_spec(),
        model_spec=ModelSpec(max_model_len=max_tokens * 2, max_num_batched_tokens=max_tokens),
        multi_threaded=True,
    )
    return BaseKVCacheManager(config=config)


def write_behind_manager(monkeypatch, tmp_path, store: str, **config) -> BaseKVCacheManager:
    """A manager with only L2, on engine store `store`, put_mode write_behind."""
    manager_env(monkeypatch)
    use_config(monkeypatch, tmp_path, remote_url=f"local://{store}", put_mode="write_behind", **config)
    return make_manager()


def connector_of(cache):
    """The L2 connector of a cache manager or an L2Cache. AIBrix keeps it in
    private attributes; this is the one place tests read them."""
    return getattr(cache, "_l2_cache", cache)._backend


def wait_flushed(cache, timeout: float = 10.0) -> None:
    """Wait until the manager's L2 connector has sent every accepted put to
    EIC, so that what follows reads EIC, not the connector's pending table."""
    assert connector_of(cache).write_behind.wait_idle(timeout), f"write-behind did not flush within {timeout} s"


def stall_next_get(monkeypatch, cache, let_go: threading.Event, max_stall_s: float):
    """The next L2Cache.get of a cache manager holds the manager's event-loop
    thread in its first step (as a stalled loop does) until `let_go` is set
    or max_stall_s passed, then runs for real. Returns (the (address,
    length) of the regions it was given, an Event set when it ended)."""
    l2 = cache._l2_cache
    original = l2.get
    given: list = []
    ended = threading.Event()

    async def stalled_get(prefix, query, mrs):
        given.extend((mr.slab.data_ptr() + mr.addr, mr.length) for mr in mrs)
        monkeypatch.setattr(l2, "get", original)
        try:
            let_go.wait(max_stall_s)  # the loop thread is stuck here
            return await original(prefix, query, mrs)
        finally:
            ended.set()

    monkeypatch.setattr(l2, "get", stalled_get)
    return given, ended


def watch_peak_counted_bytes(table) -> list[int]:
    """Record the most bytes a write-behind PendingTable counted against its
    bound after any add; returns a one-element list holding that peak."""
    peak = [0]
    add = table.add

    def watched_add(*args, **kwargs):
        add(*args, **kwargs)
        peak[0] = max(peak[0], table.counted_bytes)

    table.add = watched_add
    return peak


def send(cache, query: TokenListView, seed: int):
    """allocate_for -> copy in -> put, as vLLM's send path does; the put's Status."""
    handle = cache.allocate_for(None, query).get()
    nbytes = cache.block_spec.block_nbytes
    for i, tensor in enumerate(handle.to_tensors()):
        tensor.view(torch.uint8).view(-1).copy_(pattern(seed, i, nbytes))
    return cache.put(None, query, handle)


def receive(cache, query: TokenListView, seed: int | None = None) -> tuple[int, bool]:
    """acquire -> check every byte (when seed is given) -> release, as vLLM's
    receive path does: (tokens reloaded, whether every block was exact)."""
    status = cache.acquire(None, query)
    if not status.is_ok():
        return 0, True
    ntokens, handle = status.get()
    nbytes = cache.block_spec.block_nbytes
    try:
        exact = seed is None or all(
            torch.equal(tensor.view(torch.uint8).view(-1), pattern(seed, i, nbytes))
            for i, tensor in enumerate(handle.to_tensors())
        )
    finally:
        handle.release()
    return ntokens, exact
