"""L2 ingestion with L1 on, AIBrix's default configuration, through the real
BaseKVCacheManager: ours with write-behind (the default), ours with direct
puts (the put path before write-behind), and aibrix-kvcache's own
EICConnector, in one run.

    python benchmarks/bench_ingestion.py [--repeats 5] [--json out.json]

With L1 on, L2 gets one block per L2Cache.put from L1's ingestion callback.
Scenarios (64 blocks unless said otherwise; engine latency per SDK call):
- sync: ingestion ALL, MAX_INFLIGHT_TOKENS=0 (synchronous L2 writes): how
  long put() takes, and when every block is in the engine store, from the
  start of the put; then every block is read back from L2 and compared.
- async: ingestion ALL, MAX_INFLIGHT_TOKENS=65536: when every block is in
  the store, from the start of the put.
- reload: the blocks dropped from L1 (L1Cache.delete), then acquire(), which
  reads them from L2 (EIC by then: the writes have finished).
- step: a 4096-token prompt as vLLM's Type1 connector handles it with the
  default ingestion (HOT): one put per 512-token chunk, then the same prompt
  again, one acquire per chunk (a hit on L1 makes the block hot, which is
  when HOT ingestion writes it to L2). The time of both passes, less the
  time with a connector that answers at once, is the added time per request.

Every connector gets its own engine store per run, so "in the store" counts
only its blocks. Results: docs/performance.md.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED", "0")
import aibrix_kvcache.cache_manager as cache_manager  # noqa: E402  (installs uvloop's policy first)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from aibrix_kvcache import BaseKVCacheManager, KVCacheConfig, TokenListView  # noqa: E402
from aibrix_kvcache.spec import KVCacheBlockLayout, KVCacheBlockSpec, KVCacheTensorSpec, ModelSpec  # noqa: E402

import aibrix_eic  # noqa: E402
from aibrix_eic.aibrix_compat.upstream import load_upstream_connector_class  # noqa: E402
from aibrix_eic.cli.runtime import scoped_env  # noqa: E402
from aibrix_eic.config import ENV_CONFIG, ENV_CONFIG_UPSTREAM  # noqa: E402
from aibrix_eic.engine import get_store  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from compare_connectors import NoopConnector, eic_backend_is, write_empty_flag_file, write_yaml  # noqa: E402

cache_manager.TESTING_DISABLE_PIN_MEMORY = True  # CPU-only torch
aibrix_eic.install()
BLOCK_NTOKENS = 16
CONNECTORS = ("write_behind", "direct", "upstream")
BLOCKS = {"64KiB": (8, 1), "2MiB": (32, 8)}  # (layers, heads) with head size 128, bf16
AIBRIX_ENV = (
    "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED",
    "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS",
)


class CountingNoop(NoopConnector):
    """Answers at once and counts the blocks it was handed: the floor that
    AIBrix's own per-block cost sets (put() returning; every block reaching
    the connector)."""

    blocks = 0

    async def mput(self, keys, mrs):
        CountingNoop.blocks += len(keys)
        return await super().mput(keys, mrs)


class _Counted:
    def __len__(self) -> int:
        return CountingNoop.blocks


def spec_of(block: str) -> KVCacheBlockSpec:
    layers, heads = BLOCKS[block]
    return KVCacheBlockSpec(
        block_ntokens=BLOCK_NTOKENS,
        block_dtype=torch.bfloat16,
        block_layout=KVCacheBlockLayout.LCND,
        tensor_spec=KVCacheTensorSpec(heads=list(range(heads)), layers=list(range(layers)), head_size=128),
    )


class Runs:
    """Builds a cache manager per run, each on its own engine store."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.upstream = load_upstream_connector_class()
        self.count = 0

    @contextlib.contextmanager
    def manager(self, who: str, block: str, latency_ms: float, ingestion: str, inflight: int, max_tokens: int):
        self.count += 1
        store = f"ingest{self.count}"
        params = f"capacity=4GiB&latency={latency_ms * 1000:g}us" if latency_ms else "capacity=4GiB"
        env = {
            "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1",
            "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": "1",
            "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "EIC",
            "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE": ingestion,
            "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": str(inflight),
        }
        if who == "upstream":
            config = {
                "remote_url": f"eic://{store}?{params}",
                "eic_instance_id": "bench",
                "eic_log_dir": os.path.join(self.directory, "eic-logs"),  # upstream's open() needs every key
                "eic_log_level": 1,
                "eic_trans_type": 3,
                "eic_kv_ttl": -1,
                "eic_kv_ns": "",
                "eic_flag_file": write_empty_flag_file(self.directory),
            }
            backend = eic_backend_is(self.upstream)
            env[ENV_CONFIG_UPSTREAM] = write_yaml(self.directory, f"{store}.yaml", config)
        elif who == "noop":
            backend = eic_backend_is(CountingNoop)
        else:
            config = {"remote_url": f"local://{store}?{params}", "put_mode": who, "warmup_keys": 0}
            backend = contextlib.nullcontext()
            env[ENV_CONFIG] = write_yaml(self.directory, f"{store}.yaml", config)
        # AIBRIX_ENV is restored too: env may set some of it for this manager.
        scoped = {name: os.environ.get(name) for name in AIBRIX_ENV} | {ENV_CONFIG: None, ENV_CONFIG_UPSTREAM: None}
        with scoped_env(scoped | env), backend:
            cache = BaseKVCacheManager(
                config=KVCacheConfig(
                    block_spec=spec_of(block),
                    model_spec=ModelSpec(max_model_len=2 * max_tokens, max_num_batched_tokens=max_tokens),
                    multi_threaded=True,
                )
            )
        cache.store = _Counted() if who == "noop" else get_store(store)
        try:
            yield cache
        finally:
            cache.close()
            if who != "noop":  # its bytes (hundreds of MiB with 2 MiB blocks) must not weigh on later runs
                get_store(store).clear()


def tokens(nblocks: int, seed: int) -> TokenListView:
    rng = np.random.default_rng(seed)
    return TokenListView(rng.integers(0, 128_000, size=nblocks * BLOCK_NTOKENS, dtype=np.int32))


def fill(cache, query, seed: int):
    handle = cache.allocate_for(None, query).get()
    for i, tensor in enumerate(handle.to_tensors()):
        tensor.view(torch.uint8).view(-1)[:8].copy_(
            torch.tensor(list((seed * 1000 + i).to_bytes(8, "little")), dtype=torch.uint8)
        )
    return handle


def wait_in_store(store, count: int, timeout_s: float = 30.0) -> float:
    deadline = time.perf_counter() + timeout_s
    while len(store) < count:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"store holds {len(store)} of {count} blocks")
        time.sleep(50e-6)
    return time.perf_counter()


def settle(cache, who: str) -> None:
    """No write of an earlier step still running: AIBrix's async ones, ours."""
    cache.flush()
    if who == "write_behind":
        assert cache._l2_cache._backend.write_behind.wait_idle(30)


def readable(cache, query, seed: int) -> float:
    """Share of the blocks read back exactly from L2 (L1 dropped first)."""
    cache._l1_cache.delete(None, query)
    status = cache.acquire(None, query)
    if not status.is_ok():
        return 0.0
    ntokens, handle = status.get()
    good = 0
    for i, tensor in enumerate(handle.to_tensors()):
        head = bytes(tensor.view(torch.uint8).view(-1)[:8].tolist())
        good += head == (seed * 1000 + i).to_bytes(8, "little")
    handle.release()
    return good / (len(query) // BLOCK_NTOKENS)


def ingest(runs: Runs, who: str, block: str, latency_ms: float, inflight: int, repeats: int) -> dict:
    """sync or async ingestion of 64 blocks, then a reload from L2."""
    puts, in_l2, reloads, readables = [], [], [], []
    with runs.manager(who, block, latency_ms, "ALL", inflight, max_tokens=2048) as cache:
        for r in range(repeats + 1):  # the first is a warm-up
            query = tokens(64, seed=r)
            handle = fill(cache, query, r)
            before = len(cache.store)
            started = time.perf_counter()
            assert cache.put(None, query, handle).is_ok()
            returned = time.perf_counter()
            landed = wait_in_store(cache.store, before + 64)
            if who == "noop":
                if r:
                    puts.append(returned - started)
                    in_l2.append(landed - started)
                continue
            settle(cache, who)
            share = readable(cache, query, r)
            settle(cache, who)  # the reads above put the blocks back into L1, and so into L2 (ALL)
            cache._l1_cache.delete(None, query)
            reload_started = time.perf_counter()
            status = cache.acquire(None, query)
            reload_s = time.perf_counter() - reload_started
            if status.is_ok():
                status.get()[1].release()
            settle(cache, who)  # the reload's own writes (ALL) must not run into the next repeat's put
            if r:
                puts.append(returned - started)
                in_l2.append(landed - started)
                reloads.append(reload_s)
                readables.append(share)
    if who == "noop":
        return {"put_ms": statistics.median(puts) * 1e3, "in_l2_ms": statistics.median(in_l2) * 1e3}
    return {
        "put_ms": statistics.median(puts) * 1e3,
        "in_l2_ms": statistics.median(in_l2) * 1e3,
        "reload_ms": statistics.median(reloads) * 1e3,
        "readable": min(readables),
    }


def step(runs: Runs, who: str, latency_ms: float, repeats: int, block: str = "64KiB") -> float:
    """Median ms of one request: a 4096-token prompt offloaded then reloaded,
    one call per 512-token chunk, ingestion HOT (the default), sync."""
    times = []
    chunk = 512 // BLOCK_NTOKENS
    with runs.manager(who, block, latency_ms, "HOT", 0, max_tokens=4096) as cache:
        for r in range(repeats + 1):
            prompt = tokens(4096 // BLOCK_NTOKENS, seed=100 + r)
            started = time.perf_counter()
            for start in range(0, len(prompt), chunk * BLOCK_NTOKENS):
                prefix = prompt[:start] if start else None
                query = prompt[start : start + chunk * BLOCK_NTOKENS]
                assert cache.put(prefix, query, fill(cache, query, r)).is_ok()
            for start in range(0, len(prompt), chunk * BLOCK_NTOKENS):
                prefix = prompt[:start] if start else None
                status = cache.acquire(prefix, prompt[start : start + chunk * BLOCK_NTOKENS])
                if status.is_ok():
                    status.get()[1].release()
            if r:
                times.append(time.perf_counter() - started)
            if who == "write_behind":
                cache._l2_cache._backend.write_behind.wait_idle(30)  # no backlog into the next request
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--blocks", nargs="*", default=list(BLOCKS), choices=list(BLOCKS))
    parser.add_argument("--no-step", action="store_true", help="skip the 4096-token step")
    args = parser.parse_args()
    results: dict = {"ingest": {}, "step": {}}
    with tempfile.TemporaryDirectory() as directory:
        runs = Runs(directory)
        for block in args.blocks:
            for latency_ms in (0, 1):
                for mode, inflight in (("sync", 0), ("async", 65536)):
                    row = {}
                    for who in (*CONNECTORS, "noop"):
                        row[who] = ingest(runs, who, block, latency_ms, inflight, args.repeats)
                    results["ingest"][f"{block}/{latency_ms}ms/{mode}"] = row
                    ours, today, theirs = row["write_behind"], row["direct"], row["upstream"]
                    print(
                        f"{block:>5} {latency_ms}ms {mode:5}  put(): ours {ours['put_ms']:7.2f} ms, upstream "
                        f"{theirs['put_ms']:7.2f} ms ({theirs['put_ms'] / ours['put_ms']:5.1f}x) | all in L2: ours "
                        f"{ours['in_l2_ms']:7.2f}, upstream {theirs['in_l2_ms']:7.2f} "
                        f"({theirs['in_l2_ms'] / ours['in_l2_ms']:4.1f}x) | reload: ours {ours['reload_ms']:6.2f}, "
                        f"direct {today['reload_ms']:6.2f}, upstream {theirs['reload_ms']:6.2f} ms | readable "
                        f"{ours['readable']:.0%}/{today['readable']:.0%}/{theirs['readable']:.0%} | "
                        f"noop: put() {row['noop']['put_ms']:.2f} ms, all handed over {row['noop']['in_l2_ms']:.2f} ms",
                        flush=True,
                    )
        for latency_ms in () if args.no_step else (0.5, 1):
            row = {who: step(runs, who, latency_ms, args.repeats) for who in (*CONNECTORS, "noop")}
            results["step"][f"{latency_ms}ms"] = row
            base = row["noop"]
            print(
                f"step 4096 tokens, {latency_ms} ms RTT: added per request ours {row['write_behind'] - base:7.2f} ms, "
                f"direct {row['direct'] - base:7.2f} ms, upstream {row['upstream'] - base:7.2f} ms "
                f"(noop {base:.2f} ms)",
                flush=True,
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fout:
            json.dump(results, fout, indent=2)


if __name__ == "__main__":
    main()
