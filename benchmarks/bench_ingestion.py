"""L2 ingestion with L1 on, AIBrix's default configuration, through the real
BaseKVCacheManager, with its controls in one run:

- l1only: L1 alone, no L2 backend (what the manager costs without L2);
- mock: L1 + AIBrix's own in-memory MOCK backend with mput/mget (the floor:
  AIBrix's cost of handing blocks to any L2 connector, plus one copy each);
- write_behind (ours, the default), direct (ours, one SDK call per put),
  both with batched L1 ingestion (aibrix_eic.aibrix_compat.ingestion, on by
  default); write_behind_stock and direct_stock: the same with
  AIBRIX_EIC_PATCH_INGESTION=0, i.e. AIBrix's one L2Cache.put per block;
- upstream (aibrix-kvcache's own EICConnector) and noop (a connector that
  answers at once) on request (--who).

    python benchmarks/bench_ingestion.py [--repeats 5] [--json out.json]
        [--who ...] [--ingestion HOT ALL] [--modes sync async] [--rtt 0 1]

With L1 on, L2 gets its blocks from L1's ingestion callback: with ALL inside
put() (every block L1 takes), with HOT inside acquire() (a block's first L1
hit); stock AIBrix makes one L2Cache.put per block (MOCK, *_stock), batched
ingestion one per run of adjacent blocks of each L1 call (ours). Scenarios (64 KiB blocks unless said otherwise; engine
latency per SDK call):
- write: 64 blocks put() into L1, then acquire()d once (the L1 hit of a
  reload; with HOT this is when they are written to L2), sync
  (MAX_INFLIGHT_TOKENS=0) or async (65536); "write path" is put() plus
  acquire(), "in L2" the time from the put until every block is in the
  backend's store, "cpu" the process's CPU time (every thread) over that
  span: on a shared host the least noisy measure of the work. Then every
  block is dropped from L1 and read back from L2 and compared, and "reload"
  times one acquire() after L1 dropped them.
- step: a 4096-token prompt as vLLM's Type1 connector handles it with the
  default ingestion (HOT, sync): one put per 512-token chunk, then the same
  prompt again, one acquire per chunk.

Ratios are against the floor (mock) of the same run. Every connector gets its
own engine store per run, so "in the store" counts only its blocks.
Results: benchmarks/RESULTS.md.
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
from aibrix_eic.aibrix_compat.ingestion import OPT_OUT_ENV as BATCHED_INGESTION_ENV  # noqa: E402
from aibrix_eic.cli.runtime import scoped_env  # noqa: E402
from aibrix_eic.config import ENV_CONFIG, ENV_CONFIG_UPSTREAM  # noqa: E402
from aibrix_eic.engine import get_store  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from compare_connectors import NoopConnector, eic_backend_is, write_empty_flag_file, write_yaml  # noqa: E402
from upstream import load_upstream_connector_class  # noqa: E402

cache_manager.TESTING_DISABLE_PIN_MEMORY = True  # CPU-only torch
aibrix_eic.install()
BLOCK_NTOKENS = 16
NBLOCKS = 64
POLL_S = 250e-6
FLOOR = "mock"
STOCK = "_stock"  # ours with AIBRIX_EIC_PATCH_INGESTION=0
OURS = ("write_behind", "direct", "write_behind" + STOCK, "direct" + STOCK)
WHO = ("l1only", FLOOR, *OURS, "upstream", "noop")
DEFAULT_WHO = ("l1only", FLOOR, "write_behind", "write_behind" + STOCK, "direct")
MODES = {"sync": 0, "async": 65536}
BLOCKS = {"64KiB": (8, 1), "2MiB": (32, 8)}  # (layers, heads) with head size 128, bf16
AIBRIX_ENV = (
    "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED",
    "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE",
    "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS",
    "AIBRIX_KV_CACHE_OL_MOCK_USE_MPUT_MGET",
    BATCHED_INGESTION_ENV,
)


class CountingNoop(NoopConnector):
    """Answers at once and counts the blocks it was handed."""

    blocks = 0

    async def mput(self, keys, mrs):
        CountingNoop.blocks += len(keys)
        return await super().mput(keys, mrs)


class _Sized:
    """len() of a backend's store that is not an engine store."""

    def __init__(self, size) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size()


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

    def __init__(self, directory: str, engine_params: str = "") -> None:
        self.directory = directory
        self.upstream = load_upstream_connector_class()
        self.count = 0
        self.engine_params = engine_params  # appended to ours' local:// store (e.g. prefault=0)

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
        backend = contextlib.nullcontext()
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
        elif who == FLOOR:
            env["AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"] = "MOCK"
            env["AIBRIX_KV_CACHE_OL_MOCK_USE_MPUT_MGET"] = "1"
        elif who == "l1only":
            env["AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"] = ""
        else:
            put_mode = who.removesuffix(STOCK)
            config = {
                "remote_url": f"local://{store}?{params}{'&' if self.engine_params else ''}{self.engine_params}",
                "put_mode": put_mode,
                "warmup_keys": 0,
                "model_id": "bench",
            }
            env[ENV_CONFIG] = write_yaml(self.directory, f"{store}.yaml", config)
            env[BATCHED_INGESTION_ENV] = "0" if who.endswith(STOCK) else "1"
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
        if who == "noop":
            cache.store = _Sized(lambda: CountingNoop.blocks)
        elif who == FLOOR:
            mock = cache._l2_cache._backend
            cache.store = _Sized(lambda: len(mock.store or ()))
        elif who == "l1only":
            cache.store = None
        else:
            cache.store = get_store(store)
        try:
            yield cache
            if who in OURS and inflight == 0:  # the rows are what they say: batched or stock
                batched_puts = cache._l2_cache._backend.health()["ingestion_puts"]
                assert (batched_puts > 0) == (not who.endswith(STOCK)), (who, batched_puts)
        finally:
            cache.close()
            if who in (*OURS, "upstream"):  # its bytes must not weigh on later runs
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
    """When the store holds count blocks; polled every POLL_S, so the
    polling adds little CPU to what cpu_ms measures."""
    deadline = time.perf_counter() + timeout_s
    while len(store) < count:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"store holds {len(store)} of {count} blocks")
        time.sleep(POLL_S)
    return time.perf_counter()


def settle(cache, who: str) -> None:
    """No write of an earlier step still running: AIBrix's async ones, ours."""
    cache.flush()
    if who.startswith("write_behind"):
        assert cache._l2_cache._backend.write_behind.wait_idle(30)


def hit(cache, query) -> None:
    """One acquire of the blocks L1 holds: their first hit (HOT writes them)."""
    status = cache.acquire(None, query)
    assert status.is_ok() and status.get()[0] == len(query), status
    status.get()[1].release()


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


def write_once(cache, who: str, r: int, samples: dict) -> None:
    """One repeat: 64 blocks put into L1 and hit once (the ingestion's L2
    writes), then checked and reloaded from L2; r == 0 is a warm-up."""
    query = tokens(NBLOCKS, seed=r)
    handle = fill(cache, query, r)
    before = len(cache.store) if cache.store is not None else 0
    cpu_started = time.process_time()
    started = time.perf_counter()
    assert cache.put(None, query, handle).is_ok()
    returned = time.perf_counter()
    hit(cache, query)
    hit_done = time.perf_counter()
    landed = wait_in_store(cache.store, before + NBLOCKS) if cache.store is not None else None
    cpu_s = time.process_time() - cpu_started
    if r:
        samples["cpu"].append(cpu_s)
        samples["put"].append(returned - started)
        samples["hit"].append(hit_done - returned)
        if landed is not None:
            samples["in_l2"].append(landed - started)
    if cache.store is None or who == "noop":  # L1 only, or nothing to read back
        settle(cache, who)
        return
    settle(cache, who)
    share = readable(cache, query, r)
    settle(cache, who)  # the reads above put the blocks back into L1, and so into L2 (ALL)
    cache._l1_cache.delete(None, query)
    reload_started = time.perf_counter()
    status = cache.acquire(None, query)
    reload_s = time.perf_counter() - reload_started
    if status.is_ok():
        status.get()[1].release()
    settle(cache, who)  # the reload's own writes must not run into the next repeat's put
    if r:
        samples["reload"].append(reload_s)
        samples["readable"].append(share)


def write(runs: Runs, whos, block: str, latency_ms: float, ingestion: str, inflight: int, repeats: int) -> dict:
    """The write scenario for every connector, their repeats interleaved
    (a rotating order), so load on the host weighs on all of them alike."""
    samples = {who: {"cpu": [], "put": [], "hit": [], "in_l2": [], "reload": [], "readable": []} for who in whos}
    with contextlib.ExitStack() as stack:
        caches = {
            who: stack.enter_context(runs.manager(who, block, latency_ms, ingestion, inflight, max_tokens=2048))
            for who in whos
        }
        for r in range(repeats + 1):
            for i in range(len(whos)):
                who = whos[(r + i) % len(whos)]
                write_once(caches[who], who, r, samples[who])
    row = {}
    for who, got in samples.items():
        result = {
            "put_ms": statistics.median(got["put"]) * 1e3,
            "hit_ms": statistics.median(got["hit"]) * 1e3,
            "write_path_ms": statistics.median(p + h for p, h in zip(got["put"], got["hit"])) * 1e3,
            "cpu_ms": statistics.median(got["cpu"]) * 1e3,
        }
        if got["in_l2"]:
            result["in_l2_ms"] = statistics.median(got["in_l2"]) * 1e3
        if got["reload"]:
            result |= {"reload_ms": statistics.median(got["reload"]) * 1e3, "readable": min(got["readable"])}
        row[who] = result
    return row


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
            if who.startswith("write_behind"):
                cache._l2_cache._backend.write_behind.wait_idle(30)  # no backlog into the next request
    return statistics.median(times) * 1e3


def ratio(row: dict, who: str, field: str) -> float | None:
    floor = row.get(FLOOR, {}).get(field)
    mine = row.get(who, {}).get(field)
    return None if not floor or mine is None else mine / floor


RATIOS = ("write_path_ms", "in_l2_ms", "cpu_ms")


def print_write_row(name: str, row: dict) -> None:
    cells = []
    for who, result in row.items():
        cell = f"{who} {result['write_path_ms']:6.2f}"
        if "in_l2_ms" in result:
            cell += f"/{result['in_l2_ms']:6.2f}"
        cell += f" cpu {result['cpu_ms']:6.2f}"
        if who not in (FLOOR, "l1only") and ratio(row, who, "write_path_ms") is not None:
            cell += " (" + "/".join(f"{ratio(row, who, field) or 0:.2f}x" for field in RATIOS) + ")"
        cells.append(cell)
    print(f"{name:24} write path/in L2/cpu ms (ratios to {FLOOR}): " + " | ".join(cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--blocks", nargs="*", default=["64KiB"], choices=list(BLOCKS))
    parser.add_argument("--who", nargs="*", default=list(DEFAULT_WHO), choices=WHO)
    parser.add_argument("--ingestion", nargs="*", default=["HOT", "ALL"], choices=["HOT", "ALL"])
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rtt", nargs="*", type=float, default=[0, 1], help="engine round trips, ms")
    parser.add_argument(
        "--step-rtt", nargs="*", type=float, default=[1], help="the step's round trips, ms (none: no step)"
    )
    parser.add_argument("--engine-params", default="", help="added to our engine stores' endpoint, e.g. prefault=0")
    args = parser.parse_args()
    results: dict = {"write": {}, "step": {}, "floor": FLOOR}
    with tempfile.TemporaryDirectory() as directory:
        runs = Runs(directory, args.engine_params)
        for block in args.blocks:
            for latency_ms in args.rtt:
                for ingestion in args.ingestion:
                    for mode in args.modes:
                        row = write(runs, args.who, block, latency_ms, ingestion, MODES[mode], args.repeats)
                        name = f"{block}/{latency_ms:g}ms/{ingestion}/{mode}"
                        for who in row:
                            for field in ("write_path_ms", "in_l2_ms", "cpu_ms"):
                                value = ratio(row, who, field)
                                if value is not None and who != FLOOR:
                                    row[who][f"{field[:-3]}_vs_floor"] = value
                        results["write"][name] = row
                        print_write_row(name, row)
        for latency_ms in args.step_rtt:
            row = {who: step(runs, who, latency_ms, args.repeats) for who in args.who if who != "l1only"}
            if "l1only" in args.who:
                row["l1only"] = step_l1only(runs, args.repeats)
            results["step"][f"{latency_ms:g}ms"] = row
            floor = row.get(FLOOR)
            print(
                f"step 4096 tokens HOT sync, {latency_ms:g} ms RTT, ms per request: "
                + " | ".join(
                    f"{who} {ms:7.2f}" + (f" ({ms / floor:.2f}x)" if floor else "") for who, ms in row.items()
                ),
                flush=True,
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fout:
            json.dump(results, fout, indent=2)


def step_l1only(runs: Runs, repeats: int) -> float:
    return step(runs, "l1only", 0, repeats)


if __name__ == "__main__":
    main()
