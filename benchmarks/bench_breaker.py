"""What an open circuit breaker costs the inference engine per operation.

While EIC is down the connector answers without touching the network. This
measures that answer, per operation, at two levels, in one run:

- connector: `await conn.get/exists/put/mget` on an event loop, next to an
  empty coroutine await (the floor of any async call);
- cache manager: `BaseKVCacheManager.exists/acquire` of 32 blocks, the calls
  vLLM's AIBrix connector makes, next to AIBrix's own MOCK backend in no-op
  mode (which answers NOT_FOUND at once) on the same manager code path.

Goal (issue 5): under 50 us per operation at the connector level.

    python benchmarks/bench_breaker.py [--json] [--iterations N]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("AIBRIX_KV_CACHE_OL_TOKEN_VALIDATION_ENABLED", "0")
os.environ.pop("AIBRIX_KV_CACHE_OL_EIC_CONFIG", None)
os.environ.pop("AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE", None)

import aibrix_kvcache.cache_manager as cache_manager  # noqa: E402  (sets uvloop policy)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from aibrix_kvcache import BaseKVCacheManager, KVCacheConfig, TokenListView  # noqa: E402
from aibrix_kvcache.memory import TensorPoolAllocator  # noqa: E402
from aibrix_kvcache.spec import KVCacheBlockLayout, KVCacheBlockSpec, KVCacheTensorSpec, ModelSpec  # noqa: E402

import aibrix_eic  # noqa: E402
from aibrix_eic.config import EICConfig  # noqa: E402
from aibrix_eic.connector import EICConnector  # noqa: E402
from aibrix_eic.engine import get_store  # noqa: E402

cache_manager.TESTING_DISABLE_PIN_MEMORY = True
aibrix_eic.install()

GOAL_US = 50.0
BLOCKS = 32


def per_op_us(loop, make_coro, iterations: int, repeats: int = 5) -> float:
    """Median over repeats of the mean time per awaited operation."""

    async def batch():
        for _ in range(iterations):
            await make_coro()

    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        loop.run_until_complete(batch())
        samples.append((time.perf_counter() - started) / iterations * 1e6)
    return statistics.median(samples)


def per_call_us(fn, iterations: int, repeats: int = 5) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(iterations):
            fn()
        samples.append((time.perf_counter() - started) / iterations * 1e6)
    return statistics.median(samples)


def connector_level(iterations: int) -> dict:
    get_store("breaker-bench").faults.unreachable = True
    config = EICConfig.from_mapping({"remote_url": "local://breaker-bench", "probe_interval_s": 60.0})
    conn = EICConnector(config, "bench_conn", ThreadPoolExecutor(2))
    assert conn.open().is_ok() and conn.breaker.tripped
    allocator = TensorPoolAllocator.create(capacity_nbytes=64 << 20)
    mrs = list(allocator.alloc([65536] * BLOCKS).get())
    keys = [i.to_bytes(16, "little") for i in range(BLOCKS)]
    loop = asyncio.new_event_loop()

    async def nothing():
        return None

    floor = per_op_us(loop, nothing, iterations)
    results = {
        "await_empty_coroutine_us": floor,
        "get_us": per_op_us(loop, lambda: conn.get(keys[0], mrs[0]), iterations),
        "exists_us": per_op_us(loop, lambda: conn.exists(keys[0]), iterations),
        "put_us": per_op_us(loop, lambda: conn.put(keys[0], mrs[0]), iterations),
        f"mget_{BLOCKS}_blocks_us": per_op_us(loop, lambda: conn.mget(keys, mrs), iterations),
        f"mput_{BLOCKS}_blocks_us": per_op_us(loop, lambda: conn.mput(keys, mrs), iterations),
    }
    assert all(not status.is_ok() for status in loop.run_until_complete(conn.mget(keys, mrs)))
    conn.close()
    loop.close()
    get_store("breaker-bench").faults.clear()
    return results


def manager_level(iterations: int) -> dict:
    spec = KVCacheBlockSpec(
        block_ntokens=16,
        block_dtype=torch.bfloat16,
        block_layout=KVCacheBlockLayout.LCND,
        tensor_spec=KVCacheTensorSpec(heads=[0, 1], layers=[0, 1], head_size=64),
    )
    query = TokenListView(np.arange(BLOCKS * 16, dtype=np.int32))
    os.environ.update(
        {
            "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "0",
            "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS": "0",
        }
    )
    results = {}
    for label, backend in (("mock_noop", "MOCK"), ("eic_breaker_open", "EIC")):
        os.environ["AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"] = backend
        os.environ["AIBRIX_KV_CACHE_OL_MOCK_USE_NOOP"] = "1"
        if backend == "EIC":
            get_store("breaker-bench-mgr").faults.unreachable = True
            path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "aibrix_eic_breaker_bench.yaml")
            with open(path, "w") as fout:
                fout.write("remote_url: local://breaker-bench-mgr\nprobe_interval_s: 60\n")
            os.environ["AIBRIX_KV_CACHE_OL_EIC_CONFIG"] = path
        manager = BaseKVCacheManager(
            config=KVCacheConfig(block_spec=spec, model_spec=ModelSpec(4096, 2048), multi_threaded=True)
        )
        assert not manager.exists(None, query).is_ok()
        results[f"{label}_exists_us"] = per_call_us(lambda m=manager: m.exists(None, query), iterations)
        results[f"{label}_acquire_us"] = per_call_us(lambda m=manager: m.acquire(None, query), iterations)
        manager.close()
    os.environ.pop("AIBRIX_KV_CACHE_OL_MOCK_USE_NOOP", None)
    os.environ.pop("AIBRIX_KV_CACHE_OL_EIC_CONFIG", None)
    get_store("breaker-bench-mgr").faults.clear()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    connector = connector_level(args.iterations)
    manager = manager_level(max(200, args.iterations // 10))
    op_keys = [k for k in connector if k != "await_empty_coroutine_us"]
    worst = max(connector[k] for k in op_keys)
    report = {
        "connector": connector,
        "manager": manager,
        "worst_connector_op_us": worst,
        "goal_us": GOAL_US,
        "goal_met": worst < GOAL_US,
        "manager_exists_ratio_to_mock_noop": manager["eic_breaker_open_exists_us"] / manager["mock_noop_exists_us"],
        "manager_acquire_ratio_to_mock_noop": manager["eic_breaker_open_acquire_us"] / manager["mock_noop_acquire_us"],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"Breaker open: cost per operation (median of 5 runs, {args.iterations} ops each)")
        print(f"  {'await of an empty coroutine':36s} {connector['await_empty_coroutine_us']:8.2f} us  (floor)")
        for key in op_keys:
            print(f"  {'connector ' + key[:-3]:36s} {connector[key]:8.2f} us")
        print(
            f"  worst connector op {worst:.2f} us; goal < {GOAL_US:.0f} us: {'met' if report['goal_met'] else 'MISSED'}"
        )
        print(f"Through BaseKVCacheManager ({BLOCKS} blocks), vs AIBrix MOCK no-op backend:")
        for op in ("exists", "acquire"):
            mock, ours = manager[f"mock_noop_{op}_us"], manager[f"eic_breaker_open_{op}_us"]
            print(f"  {op:8s} mock no-op {mock:8.1f} us   eic breaker-open {ours:8.1f} us   ratio {ours / mock:.2f}")
    return 0 if report["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
