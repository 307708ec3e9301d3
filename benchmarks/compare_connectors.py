"""Our EICConnector against aibrix-kvcache's own EICConnector, and both
against a plain memcpy of the same bytes, through AIBrix's L2Cache.

    python benchmarks/compare_connectors.py [--iterations 9] [--json out.json]
    python benchmarks/compare_connectors.py --loop as-is/small/put/ours

Both connectors run in this process on the embedded engine, one store per
condition, with AIBrix's defaults around them (op_batch 32, an 8-thread L2
executor, ROLLING_HASH keys), and are measured in interleaved rounds so
drifting load on the machine hits all of them alike. Conditions: the engine
as is, and the engine with a simulated round trip of 1 ms per SDK call
(`latency=1ms`).

How each is built:
- ours: `L2Cache("EIC", ...)` with $AIBRIX_KV_CACHE_OL_EIC_CONFIG naming a
  `local://` config; AIBrix's factory resolves EIC to aibrix_eic.
- upstream: the same `L2Cache("EIC", ...)` call while the module AIBrix
  imports for EIC (`aibrix_kvcache.l2.connectors.eic`) is, for the duration
  of the call, one whose EICConnector is upstream's class; that class is
  loaded by upstream.py (this folder) with our engine bound as its `eic` (so its
  `eic://NAME?params` endpoint names an engine store).
- memcpy: ctypes.memmove of each block into pre-faulted buffers, one thread.
  Its puts alternate between two buffer sets, as the engine's overwrites do
  (a new value is written before the old one is released).

Beside them, two floors that show what bounds each ratio: `noop` is
L2Cache around a connector that answers at once (AIBrix's own cost), and
`engine` is the SDK calls alone, without any framework.

Both connectors register the allocator's slabs, as the cache manager does.
Every get and exists is checked for a full count, and the bytes of a get
are compared once per connector, so a fast failure cannot pass as speed.
`--loop CONDITION/WORKLOAD/OP/WHO` repeats one call for a profiler instead
(see benchmarks/README.md). Results: benchmarks/RESULTS.md.
"""

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# aibrix_kvcache reads this at import; importing cache_manager installs
# uvloop's event-loop policy, so every loop below is a uvloop loop.
os.environ.setdefault("AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED", "0")
os.environ.setdefault("TQDM_DISABLE", "1")
import aibrix_kvcache.cache_manager  # noqa: E402,F401
import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from aibrix_kvcache import TokenListView  # noqa: E402
from aibrix_kvcache.l2 import KeyBuilder, L2Cache  # noqa: E402
from aibrix_kvcache.l2.connectors import Connector, ConnectorFeature  # noqa: E402
from aibrix_kvcache.memory import TensorPoolAllocator  # noqa: E402
from aibrix_kvcache.spec import KVCacheBlockLayout, KVCacheBlockSpec, KVCacheTensorSpec  # noqa: E402
from aibrix_kvcache.status import Status  # noqa: E402

import aibrix_eic  # noqa: E402
import aibrix_eic.engine as engine  # noqa: E402
from aibrix_eic.config import ENV_CONFIG, ENV_CONFIG_UPSTREAM  # noqa: E402
from aibrix_eic.plugin import SHIM_MODULE  # noqa: E402
from aibrix_eic.util.units import format_size  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from upstream import load_upstream_connector_class  # noqa: E402

OP_BATCH = 32  # AIBRIX_KV_CACHE_OL_L2_CACHE_OP_BATCH default
L2_WORKERS = 8  # AIBRIX_KV_CACHE_OL_L2_CACHE_NUM_ASYNC_WORKERS default
BLOCK_NTOKENS = 16
CONNECTORS = ("ours", "upstream")
# Floors, measured beside them to show what bounds a ratio: "noop" is
# L2Cache around a connector that answers at once (AIBrix's own cost);
# "engine" is the SDK calls alone, no framework: one mset/mget of every
# block, and one mexist per op_batch keys for exists (L2Cache's rounds).
FLOORS = ("noop", "engine")
CPUS = os.cpu_count() or 1


@dataclass(frozen=True)
class Workload:
    name: str
    layers: int
    heads: int  # with head size 128, bf16, 16 tokens: 8 KiB x layers x heads
    nblocks: int

    @property
    def block_spec(self) -> KVCacheBlockSpec:
        return KVCacheBlockSpec(
            block_ntokens=BLOCK_NTOKENS,
            block_dtype=torch.bfloat16,
            block_layout=KVCacheBlockLayout.LCND,
            tensor_spec=KVCacheTensorSpec(
                heads=list(range(self.heads)), layers=list(range(self.layers)), head_size=128
            ),
        )

    @property
    def block_nbytes(self) -> int:
        return self.block_spec.block_nbytes

    @property
    def label(self) -> str:
        return f"{format_size(self.block_nbytes)} x {self.nblocks}"


@dataclass(frozen=True)
class Condition:
    name: str
    store: str
    params: str  # engine endpoint parameters

    def endpoint(self) -> str:
        return f"{self.store}?{self.params}"


WORKLOADS = (
    Workload("large", layers=32, heads=8, nblocks=64),  # 2 MiB blocks, a llama3-8b request of 1024 tokens
    Workload("small", layers=8, heads=1, nblocks=256),  # 64 KiB blocks
)
CONDITIONS = (
    Condition("as-is", "compare-asis", "capacity=2GiB"),
    Condition("rtt-1ms", "compare-rtt", "capacity=2GiB&latency=1ms"),
)


# ------------------------------------------------------------------ building
def write_yaml(directory: str, name: str, values: dict) -> str:
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as fout:
        yaml.safe_dump(values, fout)
    return path


def write_empty_flag_file(directory: str) -> str:
    """An empty SDK flag file for upstream's config: upstream assigns
    InitOption.flag_file even when the key is null, which a typed binding
    (and the engine) refuses."""
    path = os.path.join(directory, "eic-flags")
    open(path, "w").close()
    return path


@contextlib.contextmanager
def env(name: str, value: str):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


@contextlib.contextmanager
def eic_backend_is(connector_class):
    """While active, AIBrix's `from .eic import EICConnector` gets this class."""
    saved = sys.modules.get(SHIM_MODULE)
    module = types.ModuleType(SHIM_MODULE)
    module.EICConnector = connector_class
    sys.modules[SHIM_MODULE] = module
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(SHIM_MODULE, None)
        else:
            sys.modules[SHIM_MODULE] = saved


class NoopConnector(Connector):
    """Answers every call at once: L2Cache's cost with nothing behind it."""

    _OK = Status.ok()

    @classmethod
    def from_envs(cls, conn_id, executor, **kwargs):
        return cls()

    @property
    def name(self) -> str:
        return "noop"

    @property
    def feature(self) -> ConnectorFeature:
        return ConnectorFeature(mput_mget=True)

    def open(self):
        return self._OK

    def close(self):
        return self._OK

    def get_batches(self, keys, mrs, batch_size):
        return [list(zip(keys, mrs))]

    async def exists(self, key):
        return self._OK

    async def mput(self, keys, mrs):
        return [self._OK] * len(keys)

    async def mget(self, keys, mrs):
        return [self._OK] * len(keys)

    async def get(self, key, mr):
        return self._OK

    async def put(self, key, mr):
        return self._OK

    async def delete(self, key):
        return self._OK


class Builder:
    """Makes an unopened L2Cache for (connector, condition, workload)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.executor = ThreadPoolExecutor(L2_WORKERS, thread_name_prefix="l2_cache_")
        self.upstream_class = load_upstream_connector_class()
        log_dir = os.path.join(directory, "eic-logs")
        flag_file = write_empty_flag_file(directory)
        self.configs = {}
        for condition in CONDITIONS:
            # direct: a put is its own SDK calls, as upstream's; timed puts and gets then
            # go to EIC (write-behind against upstream: bench_ingestion.py)
            ours = {"remote_url": f"local://{condition.endpoint()}", "put_mode": "direct"}
            self.configs["ours", condition.name] = write_yaml(directory, f"ours-{condition.store}.yaml", ours)
            self.configs["upstream", condition.name] = write_yaml(
                directory,
                f"upstream-{condition.store}.yaml",
                {
                    "remote_url": f"eic://{condition.endpoint()}",
                    "eic_instance_id": "compare",
                    "eic_log_dir": log_dir,  # without it upstream's open() raises
                    "eic_log_level": 1,
                    "eic_trans_type": 3,
                    "eic_kv_ttl": -1,
                    "eic_kv_ns": "",
                    "eic_flag_file": flag_file,
                },
            )

    def l2cache(self, connector: str, condition: Condition, workload: Workload) -> L2Cache:
        def build() -> L2Cache:
            return L2Cache(
                backend_name="EIC",
                placement_policy="SIMPLE",
                namespace="aibrix",
                block_spec=workload.block_spec,
                executor=self.executor,
                op_batch=OP_BATCH,
                key_builder=KeyBuilder.create("ROLLING_HASH", block_size=BLOCK_NTOKENS),
            )

        if connector == "noop":
            with eic_backend_is(NoopConnector):
                return build()
        path = self.configs[connector, condition.name]
        if connector == "ours":
            with env(ENV_CONFIG, path):
                cache = build()
            assert type(cache._backend).__module__ == "aibrix_eic.connector", type(cache._backend)
            return cache
        with env(ENV_CONFIG_UPSTREAM, path), eic_backend_is(self.upstream_class):
            cache = build()
        assert type(cache._backend) is self.upstream_class, type(cache._backend)
        return cache


# ---------------------------------------------------------------- measuring
class Bench:
    """One condition and workload: both connectors' caches, opened, plus
    the memory every method reads and writes."""

    def __init__(self, builder: Builder, allocator: TensorPoolAllocator, condition: Condition, workload: Workload):
        self.loop = asyncio.new_event_loop()
        self.workload = workload
        nbytes = workload.block_nbytes
        rng = np.random.default_rng(workload.nblocks)
        self.tokens = TokenListView(rng.integers(0, 128_000, size=workload.nblocks * BLOCK_NTOKENS, dtype=np.int32))
        self.src = self._mrs(allocator, nbytes, workload.nblocks)
        for mr in self.src:
            mr.to_tensor().copy_(torch.from_numpy(rng.integers(0, 256, size=nbytes, dtype=np.uint8)))
        self.dst = {name: self._mrs(allocator, nbytes, workload.nblocks) for name in (*CONNECTORS, "memcpy", "engine")}
        self.dst["noop"] = self.dst["memcpy"]  # never written
        self.caches = {}
        for name in (*CONNECTORS, "noop"):
            cache = builder.l2cache(name, condition, workload)
            opened = cache.open()
            assert opened.is_ok(), (name, opened)
            if cache.feature.rdma:  # as the cache manager does
                registered = cache.register_slabs(allocator.slabs)
                assert registered.is_ok(), (name, registered)
            self.caches[name] = cache
        self.client = engine.Client()
        assert self.client.init("compare", condition.endpoint(), engine.InitOption()) == 0
        self.engine_keys = [f"floor.{workload.name}.{i}" for i in range(workload.nblocks)]
        # memcpy's stand-in for the store: two pre-faulted buffer sets.
        self.copies = [np.ones(workload.nblocks * nbytes, dtype=np.uint8) for _ in range(2)]
        self.put_round = 0

    @staticmethod
    def _mrs(allocator: TensorPoolAllocator, nbytes: int, nblocks: int):
        mrs = list(allocator.alloc([nbytes] * nblocks).get())
        assert len(mrs) == nblocks
        for mr in mrs:
            mr.block_nbytes = nbytes
        return mrs

    def close(self) -> None:
        for cache in self.caches.values():
            cache.close()
        for mrs in (self.src, *{id(mrs): mrs for mrs in self.dst.values()}.values()):
            for mr in mrs:
                mr.ref_down()
        self.loop.close()

    def _engine_call(self, op: str, keys, mrs) -> None:
        names = engine.StringVector()
        names.extend(keys)
        if op == "mexist":
            status, _ = self.client.mexist(names, engine.ExistOption())
        else:
            buffers = engine.IOBuffers()
            for mr in mrs:
                buffers.append(mr.data_ptr(), mr.length, False)
            if op == "mset":
                status, _ = self.client.mset(names, buffers, engine.SetOption())
            else:
                status, _, _ = self.client.mget(names, engine.GetOption(), buffers)
        assert status == engine.StatusCode.SUCCESS, (op, status)

    # One timed call each; all return seconds.
    def put(self, name: str) -> float:
        if name == "memcpy":
            target = self.copies[self.put_round % 2].ctypes.data
            self.put_round += 1
            nbytes = self.workload.block_nbytes
            started = time.perf_counter()
            for i, mr in enumerate(self.src):
                ctypes.memmove(target + i * nbytes, mr.data_ptr(), nbytes)
            return time.perf_counter() - started
        if name == "engine":
            started = time.perf_counter()
            self._engine_call("mset", self.engine_keys, self.src)
            return time.perf_counter() - started
        cache = self.caches[name]
        started = time.perf_counter()
        status = self.loop.run_until_complete(cache.put(None, self.tokens, self.src))
        elapsed = time.perf_counter() - started
        assert status.is_ok() and status.get() == self.workload.nblocks, (name, "put", status)
        return elapsed

    def get(self, name: str) -> float:
        if name == "memcpy":
            source = self.copies[0].ctypes.data
            nbytes = self.workload.block_nbytes
            started = time.perf_counter()
            for i, mr in enumerate(self.dst["memcpy"]):
                ctypes.memmove(mr.data_ptr(), source + i * nbytes, nbytes)
            return time.perf_counter() - started
        if name == "engine":
            started = time.perf_counter()
            self._engine_call("mget", self.engine_keys, self.dst["engine"])
            return time.perf_counter() - started
        cache = self.caches[name]
        started = time.perf_counter()
        status = self.loop.run_until_complete(cache.get(None, self.tokens, self.dst[name]))
        elapsed = time.perf_counter() - started
        assert status.is_ok() and status.get() == self.workload.nblocks, (name, "get", status)
        return elapsed

    def exists(self, name: str) -> float:
        if name == "engine":
            started = time.perf_counter()
            for first in range(0, len(self.engine_keys), OP_BATCH):
                self._engine_call("mexist", self.engine_keys[first : first + OP_BATCH], None)
            return time.perf_counter() - started
        cache = self.caches[name]
        started = time.perf_counter()
        status = self.loop.run_until_complete(cache.exists(None, self.tokens))
        elapsed = time.perf_counter() - started
        assert status.is_ok() and status.get() == self.workload.nblocks, (name, "exists", status)
        return elapsed

    def verify_gets(self) -> None:
        for name in CONNECTORS:
            for mr in self.dst[name]:
                mr.to_tensor().zero_()
            self.get(name)
            for i, (sent, got) in enumerate(zip(self.src, self.dst[name])):
                if not torch.equal(sent.to_tensor(), got.to_tensor()):
                    raise AssertionError(f"{name}: block {i} read back differs from what was put")


def interleaved(timed_call, names, iterations: int) -> dict[str, float]:
    """Median seconds of timed_call(name) for each name, measured round-robin."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(iterations):
        for name in names:
            samples[name].append(timed_call(name))
    return {name: statistics.median(values) for name, values in samples.items()}


def time_open(
    builder: Builder, condition: Condition, workload: Workload, iterations: dict[str, int]
) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in CONNECTORS}
    for round_index in range(max(iterations.values())):
        for name in CONNECTORS:
            if round_index >= iterations[name]:
                continue
            cache = builder.l2cache(name, condition, workload)
            started = time.perf_counter()
            status = cache.open()
            samples[name].append(time.perf_counter() - started)
            assert status.is_ok(), (name, "open", status)
            cache.close()
    return {name: statistics.median(values) for name, values in samples.items()}


def run(iterations: int) -> dict:
    results: dict = {"conditions": {}}
    with tempfile.TemporaryDirectory(prefix="compare-connectors-") as directory:
        builder = Builder(directory)
        # One allocator per block size, as each cache manager has its own
        # (AIBrix's pool hands back freed regions at their old size). Room
        # for the source and four destinations, pre-faulted: production
        # slabs are pinned, so their pages are always present.
        allocators = {}
        for workload in WORKLOADS:
            allocator = TensorPoolAllocator.create(capacity_nbytes=5 * workload.block_nbytes * workload.nblocks)
            for slab in allocator.slabs:
                ctypes.memset(slab.data_ptr(), 0, slab.numel())
            allocators[workload.name] = allocator
        for condition in CONDITIONS:
            per_workload = {}
            for workload in WORKLOADS:
                bench = Bench(builder, allocators[workload.name], condition, workload)
                try:
                    # Warm-up: the first two overwrites fault fresh engine buffers.
                    for _ in range(3):
                        for name in (*CONNECTORS, "memcpy", *FLOORS):
                            bench.put(name)
                    bench.verify_gets()
                    gc.collect()
                    gc.disable()
                    try:
                        everyone = (*CONNECTORS, "memcpy", *FLOORS)
                        put = interleaved(bench.put, everyone, iterations)
                        get = interleaved(bench.get, everyone, iterations)
                        exists = interleaved(bench.exists, (*CONNECTORS, *FLOORS), iterations)
                    finally:
                        gc.enable()
                finally:
                    bench.close()
                per_workload[workload.name] = {
                    "block_nbytes": workload.block_nbytes,
                    "nblocks": workload.nblocks,
                    "put_s": put,
                    "get_s": get,
                    "exists_s": exists,
                }
            # upstream's open() makes 2048 serial calls: ~2 s each at 1 ms.
            open_iterations = {"ours": iterations, "upstream": 3 if "latency" in condition.params else iterations}
            per_workload["open_s"] = time_open(builder, condition, WORKLOADS[0], open_iterations)
            results["conditions"][condition.name] = per_workload
            engine.get_store(condition.store).clear()
        builder.executor.shutdown(wait=False)
    return results


# ------------------------------------------------------------------ report
@dataclass(frozen=True)
class Goal:
    text: str
    condition: str
    workload: str | None  # None: open(), measured once per condition
    op: str
    baseline: str  # "memcpy" or "upstream"
    minimum: float


GOALS = (
    Goal("2 MiB x 64, put: ours >= 0.5x memcpy", "as-is", "large", "put", "memcpy", 0.5),
    Goal("2 MiB x 64, get: ours >= 0.5x memcpy", "as-is", "large", "get", "memcpy", 0.5),
    Goal("64 KiB x 256, put: ours >= 2x upstream ops/s", "as-is", "small", "put", "upstream", 2.0),
    Goal("64 KiB x 256, get: ours >= 2x upstream ops/s", "as-is", "small", "get", "upstream", 2.0),
    Goal("1 ms RTT, exists of 256: ours >= 4x upstream", "rtt-1ms", "small", "exists", "upstream", 4.0),
    Goal("1 ms RTT, get of 256: ours >= 2x upstream", "rtt-1ms", "small", "get", "upstream", 2.0),
    Goal("1 ms RTT, open(): ours >= 10x upstream", "rtt-1ms", None, "open", "upstream", 10.0),
)


def times_of(results: dict, condition: str, workload: str | None, op: str) -> dict[str, float]:
    section = results["conditions"][condition]
    return section["open_s"] if workload is None else section[workload][f"{op}_s"]


def best_possible(times: dict[str, float], op: str) -> float:
    """Seconds a connector with no cost of its own would take: AIBrix's
    L2Cache around it, the SDK's per-call work, and the copies spread over
    every CPU (the copies are the only part that runs in parallel)."""
    if op == "exists":
        return times["noop"] + times["engine"]
    copy = times["memcpy"]
    return times["noop"] + max(times["engine"] - copy, 0.0) + copy / CPUS


def goal_ratio(results: dict, goal: Goal) -> float:
    times = times_of(results, goal.condition, goal.workload, goal.op)
    return times[goal.baseline] / times["ours"]


def goal_bound(results: dict, goal: Goal) -> float | None:
    if goal.workload is None:
        return None
    times = times_of(results, goal.condition, goal.workload, goal.op)
    return times[goal.baseline] / best_possible(times, goal.op)


def render(results: dict) -> str:
    columns = ("ours", "upstream", "memcpy", "noop", "engine")
    header = (
        f"{'condition':<9} {'workload':<13} {'op':<6} "
        + " ".join(f"{name:>9}" for name in columns)
        + f"   {'ours/memcpy':>11} {'ours/upstream':>13}"
    )
    lines = [
        "Median ms per call (noop: L2Cache around a connector that does nothing; engine: the SDK calls alone)",
        "",
        header,
        "-" * len(header),
    ]
    for condition, section in results["conditions"].items():
        for workload in WORKLOADS:
            data = section[workload.name]
            for op in ("put", "get", "exists"):
                times = data[f"{op}_s"]
                cells = " ".join(f"{times[name] * 1000:9.2f}" if name in times else f"{'-':>9}" for name in columns)
                vs_memcpy = f"{times['memcpy'] / times['ours']:10.2f}x" if "memcpy" in times else f"{'-':>11}"
                lines.append(
                    f"{condition:<9} {workload.label:<13} {op:<6} {cells}   {vs_memcpy} {times['upstream'] / times['ours']:12.2f}x"
                )
            nbytes = data["block_nbytes"] * data["nblocks"]
            rates = []
            for op in ("put", "get"):
                times = data[f"{op}_s"]
                rates.append(
                    f"{op} {nbytes / times['ours'] / 1e9:.2f} GB/s, {data['nblocks'] / times['ours']:,.0f} blocks/s "
                    f"(upstream {data['nblocks'] / times['upstream']:,.0f})"
                )
            lines.append(f"{'':<9} {'':<13} ours: {'; '.join(rates)}")
        opened = section["open_s"]
        lines.append(
            f"{condition:<9} {'open()':<13} {'':<6} {opened['ours'] * 1000:9.2f} {opened['upstream'] * 1000:9.2f}"
            f"{'':>30}   {'-':>11} {opened['upstream'] / opened['ours']:12.2f}x"
        )
    lines += [
        "",
        "Ratios are of median times; above 1 means ours is faster.",
        "",
        "Goals (best possible: a connector "
        "that costs nothing itself, with the same L2Cache and SDK calls, copies split over "
        f"{CPUS} CPUs):",
    ]
    for goal in GOALS:
        ratio = goal_ratio(results, goal)
        bound = goal_bound(results, goal)
        verdict = "met" if ratio >= goal.minimum else "MISSED"
        best = f"   (best possible {bound:.2f}x)" if bound is not None else ""
        lines.append(f"  {verdict:<6} {goal.text}: {ratio:.2f}x{best}")
    return "\n".join(lines)


def loop_for_profiler(spec: str, seconds: float) -> None:
    """Repeat one measured call for `seconds`, for a sampling profiler:
    py-spy record --gil -- python benchmarks/compare_connectors.py --loop as-is/small/put/ours"""
    condition_name, workload_name, op, name = spec.split("/")
    condition = next(c for c in CONDITIONS if c.name == condition_name)
    workload = next(w for w in WORKLOADS if w.name == workload_name)
    with tempfile.TemporaryDirectory(prefix="compare-connectors-") as directory:
        allocator = TensorPoolAllocator.create(capacity_nbytes=5 * workload.block_nbytes * workload.nblocks)
        for slab in allocator.slabs:
            ctypes.memset(slab.data_ptr(), 0, slab.numel())
        bench = Bench(Builder(directory), allocator, condition, workload)
        try:
            for _ in range(3):
                bench.put(name)
            timed_call = getattr(bench, op)
            samples = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                samples.append(timed_call(name))
        finally:
            bench.close()
    print(f"{spec}: {len(samples)} calls, median {statistics.median(samples) * 1000:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=9, help="timed rounds per measurement (median taken)")
    parser.add_argument("--json", metavar="FILE", help="also write the raw medians as JSON")
    parser.add_argument(
        "--loop",
        metavar="CONDITION/WORKLOAD/OP/WHO",
        help="only repeat one call, e.g. as-is/small/put/ours, for a profiler to sample",
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="how long --loop runs")
    args = parser.parse_args()
    aibrix_eic.install()
    torch.set_num_threads(1)  # no idle OpenMP workers spinning between calls
    if args.loop:
        loop_for_profiler(args.loop, args.seconds)
        return 0
    started = time.perf_counter()
    results = run(args.iterations)
    results["iterations"] = args.iterations
    results["wall_s"] = time.perf_counter() - started
    results["goals"] = {
        goal.text: {
            "ratio": goal_ratio(results, goal),
            "best_possible": goal_bound(results, goal),
            "minimum": goal.minimum,
        }
        for goal in GOALS
    }
    print(render(results))
    print(
        f"\n{args.iterations} rounds per measurement, {results['wall_s']:.0f} s in all, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fout:
            json.dump(results, fout, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
