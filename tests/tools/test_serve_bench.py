"""benchmarks/serve.py without vLLM: the `upstream` phase's environment leaves
AIBrix its own EIC connector, with our engine as `eic`; the `type2` and `pd`
phases start the servers they name, and the PD proxy does a router's two
requests; the same-run ratios and table cope with the phases a short run
leaves out."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serve():
    """The script as a module; the e2e helpers it puts on sys.path (generic
    names: model, server) are taken off again."""
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    spec = importlib.util.spec_from_file_location("serve_bench", REPO / "benchmarks" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved_path
        for name in ("model", "server", "e2e_ttft", "pd_proxy", "cpu_profile"):
            if name not in saved_modules:
                sys.modules.pop(name, None)
    return module


# Whether our shim answers AIBrix's `from .eic import EICConnector` (when it
# does not, AIBrix's own module loads), and what `import eic` gives. Not
# importing aibrix_kvcache keeps each interpreter under a second; the shim's
# effect on AIBrix's factory is tools/test_factory.py's.
WHICH = "import eic; print(eic.__name__); import aibrix_eic.plugin as p; print(p.is_installed())"


def _interpreter(env_update: dict[str, str], tmp_path: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIBRIX_", "VLLM_"))}
    env.update(env_update)
    env["AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"] = "EIC"
    done = subprocess.run(
        [sys.executable, "-c", WHICH], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_upstream_phase_switches_our_shim_off_and_binds_the_engine_as_eic(serve, tmp_path):
    env = serve.upstream_env(tmp_path, "local://serve-upstream?capacity=1GiB")
    assert _interpreter(env, tmp_path) == ["aibrix_eic.engine", "False"]
    config = serve.json.loads(Path(env["AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE"]).read_text())
    assert {"eic_log_dir", "eic_log_level", "eic_trans_type"} <= set(config)
    assert config["remote_url"] == "eic://serve-upstream?capacity=1GiB"


def test_without_the_opt_out_our_shim_answers(serve, tmp_path):
    """The control: the same interpreter with our .pth hook on routes EIC to us."""
    env = serve.upstream_env(tmp_path, "local://serve-upstream")
    del env["AIBRIX_EIC_DISABLE_AUTOLOAD"]
    assert _interpreter(env, tmp_path) == ["aibrix_eic.engine", "True"]


def _pass(ttft_p50_ms: float) -> dict:
    keys = dict.fromkeys(("request_throughput", "output_throughput", "total_token_throughput", "request_goodput"), 1.0)
    keys |= dict.fromkeys(("mean_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms"), 1.0)
    return keys | {
        "p50_ttft_ms": ttft_p50_ms,
        "failed": 0,
        "peak_rss_gib": 5.0,
        "reused_tokens": 0,
        "reused_fraction": 0.0,
        "eic_get_hit_blocks": None,
        "engine_hit_blocks": None,
        "wall_s": 1.0,
    }


def test_ratios_use_pass_two_and_skip_phases_not_run(serve):
    results = {
        "eic": {"pass1": _pass(9000), "pass2": _pass(300), "wall_s": 1.0},
        "eic-default": {"pass1": _pass(9000), "pass2": _pass(900), "wall_s": 1.0},
        "vllm-prefix": {"pass1": _pass(9000), "pass2": _pass(200), "wall_s": 1.0},
    }
    ratios = serve.ratios(results)
    assert ratios == pytest.approx(
        {"eic_over_vllm_prefix": 1.5, "eic_default_over_vllm_prefix": 4.5, "l1_on_over_l1_off": 3.0}
    )
    table = serve.table({"results": results, "ratios": ratios})
    assert table.count("\n| eic") == 4 and "l1_on_over_l1_off: 3.00x" in table


def _kv_transfer(server) -> dict:
    return json.loads(server.argv[server.argv.index("--kv-transfer-config") + 1])


def test_type2_phase_runs_the_type2_adapter(serve, tmp_path):
    args = serve.parse_args(["--phases", "type2"])
    (server,) = serve.phase_servers("type2", tmp_path / "model", tmp_path, args)
    assert _kv_transfer(server)["kv_connector_module_path"] == "cpu_type2"
    assert server.env["AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"] == "EIC"
    config = Path(server.env["AIBRIX_KV_CACHE_OL_EIC_CONFIG"]).read_text()
    assert config.startswith("remote_url: local://serve-type2")


def test_pd_phase_starts_a_prefiller_and_a_decoder_on_one_shared_store(serve, tmp_path):
    args = serve.parse_args(["--phases", "pd"])
    prefill, decode = serve.phase_servers("pd", tmp_path / "model", tmp_path, args)
    roles = {s.name: (_kv_transfer(s)["kv_role"], _kv_transfer(s)["engine_id"]) for s in (prefill, decode)}
    assert roles == {"pd-prefill": ("kv_both", "pd-prefill"), "pd-decode": ("kv_consumer", "pd-decode")}
    assert {_kv_transfer(s)["kv_connector_module_path"] for s in (prefill, decode)} == {"cpu_pd_reuse"}
    (config,) = {s.env["AIBRIX_KV_CACHE_OL_EIC_CONFIG"] for s in (prefill, decode)}
    url = Path(config).read_text().split("remote_url: ", 1)[1].strip()
    store_dir = Path(url.split("dir=", 1)[1].split("&", 1)[0])
    assert url.startswith("local://serve-pd?") and store_dir.is_dir()  # made beforehand: no create=1 needed
    assert prefill.env["PROMETHEUS_MULTIPROC_DIR"] != decode.env["PROMETHEUS_MULTIPROC_DIR"]


def test_a_pd_decoder_can_reuse_the_whole_prompt(serve):
    assert serve.reusable_tokens([1000, 33]) == 992 + 32
    assert serve.reusable_tokens([1000, 33], pd=True) == 1033


def test_pd_ratios_compare_pass_one_with_a_colocated_server(serve):
    results = {
        "plain": {"pass1": _pass(4000), "pass2": _pass(4000), "wall_s": 1.0},
        "pd": {"pass1": _pass(5000), "pass2": _pass(1000), "wall_s": 1.0},
    }
    results["pd"]["pass1"]["p50_tpot_ms"] = 0.5
    ratios = serve.ratios(results)
    assert ratios == pytest.approx({"pd_over_plain_pass1_ttft": 1.25, "pd_over_plain_pass1_tpot": 0.5})


class _Upstream(ThreadingHTTPServer):
    """A stand-in for a vLLM server: records each body, answers as the
    prefiller or decoder would (the decoder streams two SSE events)."""

    daemon_threads = True

    def __init__(self, role: str) -> None:
        self.role = role
        self.bodies: list[dict] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                upstream.bodies.append(body)
                if upstream.role == "prefill":
                    payload = json.dumps({"id": "cmpl-p", "kv_transfer_params": {"do_remote_prefill": True}}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for event in (b'data: {"id": "cmpl-d"}\n\n', b"data: [DONE]\n\n"):
                    self.wfile.write(event)
                    self.wfile.flush()

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_pd_proxy_prefills_one_token_then_decodes_with_the_returned_params(serve):
    prefill, decode = _Upstream("prefill"), _Upstream("decode")
    body = {
        "model": "m",
        "prompt": [5, 6, 7],
        "max_tokens": 9,
        "min_tokens": 9,
        "stream": True,
        "stream_options": {"x": 1},
    }
    try:
        with serve.PDProxy(prefill.url, decode.url) as proxy:
            request = urllib.request.Request(
                f"{proxy.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=30) as reply:
                streamed = reply.read()
    finally:
        for upstream in (prefill, decode):
            upstream.shutdown()
            upstream.server_close()
    (to_prefill,) = prefill.bodies
    assert to_prefill["kv_transfer_params"] == {"do_remote_decode": True}
    assert to_prefill["max_tokens"] == 1 and to_prefill["stream"] is False
    assert "stream_options" not in to_prefill and "min_tokens" not in to_prefill
    (to_decode,) = decode.bodies
    assert to_decode == dict(body, kv_transfer_params={"do_remote_prefill": True})
    assert streamed == b'data: {"id": "cmpl-d"}\n\ndata: [DONE]\n\n'
    assert [step.prefill_id for step in proxy.history] == ["cmpl-p"]


def test_the_default_phases_run_batched_and_stock_l1_ingestion_side_by_side(serve, tmp_path):
    from aibrix_eic.aibrix_compat import ingestion

    args = serve.parse_args(["--l1-gb", "1.5"])
    assert {"eic", "eic-default", "eic-default-stock", "vllm-prefix"} <= set(args.phases)
    batched = serve.phase_server("eic-default", tmp_path, tmp_path, args).env
    stock = serve.phase_server("eic-default-stock", tmp_path, tmp_path, args).env
    l1_off = serve.phase_server("eic", tmp_path, tmp_path, args).env
    for env in (batched, stock):
        assert env["AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED"] == "1"
        assert env["AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB"] == "1.5"
        assert "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE" not in env  # AIBrix's default, HOT
    assert batched[ingestion.OPT_OUT_ENV] == "1" and stock[ingestion.OPT_OUT_ENV] == "0"
    assert serve.BATCHED_INGESTION_ENV == ingestion.OPT_OUT_ENV
    assert l1_off["AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED"] == "0"
    assert ingestion.OPT_OUT_ENV not in l1_off


def test_the_batched_ingestion_log_line_is_the_one_the_connector_writes(serve, tmp_path):
    """The script reads the server's log for ingestion.py's start-up line
    (tests/aibrix/test_batched_ingestion.py checks a manager logs it)."""
    from aibrix_eic.aibrix_compat import ingestion

    assert serve.BATCHED_LOG_LINE == ingestion.BATCHED_LOG_LINE
    log = tmp_path / "server.log"
    log.write_text(f"INFO 12-03 [ingestion.py:109] EIC: {ingestion.BATCHED_LOG_LINE}: one L2Cache.put ...\n")
    assert serve.batched_ingestion_logged(log)
    log.write_text("nothing about ingestion")
    assert not serve.batched_ingestion_logged(log)
    assert not serve.batched_ingestion_logged(tmp_path / "missing.log")


def test_goals_need_both_phases_and_are_judged_per_run(serve):
    results = {
        "eic": {"pass1": _pass(9000), "pass2": _pass(600), "wall_s": 1.0},
        "eic-default": {"pass1": _pass(9000), "pass2": _pass(540), "wall_s": 1.0, "batched_ingestion": True},
        "eic-default-stock": {"pass1": _pass(9000), "pass2": _pass(1200), "wall_s": 1.0, "batched_ingestion": False},
        "l1-only": {"pass1": _pass(9000), "pass2": _pass(300), "wall_s": 1.0},
    }
    ratios = serve.ratios(results)
    assert ratios["l1_on_over_l1_off"] == pytest.approx(0.9)
    assert ratios["eic_default_over_l1_only"] == pytest.approx(1.8)
    assert ratios["batched_over_stock_ingestion"] == pytest.approx(0.45)
    assert ratios["stock_l1_on_over_l1_off"] == pytest.approx(2.0)
    assert serve.goals(ratios) == {"l1_on_over_l1_off": True, "eic_default_over_l1_only": False}
    assert serve.goals({"l1_on_over_l1_off": 1.31}) == {"l1_on_over_l1_off": False}
    table = serve.table({"results": results, "ratios": ratios})
    assert "goal eic_default_over_l1_only <= 1.5x: MISSED" in table
    assert "eic-default yes, eic-default-stock no" in table


def test_tier_replica_phase_runs_two_tier_servers_on_one_shared_store(serve, tmp_path):
    args = serve.parse_args(["--phases", "tier-replica"])
    first, second = serve.replica_servers(tmp_path / "model", tmp_path, args)
    assert (first.name, second.name) == ("replica-a", "replica-b")
    (tiers,) = {json.dumps(_kv_transfer(s)["kv_connector_extra_config"]["secondary_tiers"]) for s in (first, second)}
    (tier,) = json.loads(tiers)
    assert tier["type"] == "EICSecondaryTier" and tier["module_path"] == "aibrix_eic.tier.manager"
    store_dir = Path(tier["remote_url"].split("dir=", 1)[1].split("&", 1)[0])
    assert store_dir.is_dir()  # a shared store, made beforehand


def test_tier_replica_ratio_is_the_second_servers_first_read_over_the_first_ones_reload(serve):
    results = {
        "tier-replica": {"pass1": _pass(9000), "pass2": _pass(400), "pass-replica": _pass(460), "wall_s": 1.0},
        "tier": {"pass1": _pass(9000), "pass2": _pass(300), "wall_s": 1.0},
        "vllm-fs": {"pass1": _pass(9000), "pass2": _pass(330), "wall_s": 1.0},
    }
    ratios = serve.ratios(results)
    assert ratios["tier_replica_first_read_over_own_reload"] == pytest.approx(1.15)
    assert ratios["tier_over_vllm_fs"] == pytest.approx(300 / 330)
    assert serve.goals(ratios) == {"tier_over_vllm_fs": True, "tier_replica_first_read_over_own_reload": False}
    table = serve.table({"results": results, "ratios": ratios})
    assert "| tier-replica | replica |" in table and table.count("\n| tier-replica") == 3


def test_tier_phases_count_the_tokens_a_connector_served(serve):
    """vLLM's offloading tiers log no "reused N tokens" line: their reuse is
    vLLM's external prefix-cache hits, summed over engines."""

    class Metrics:
        def metrics(self):
            return {
                ("vllm:external_prefix_cache_hits_total", frozenset({("engine", "0")})): 1984.0,
                ("vllm:external_prefix_cache_hits_total", frozenset({("engine", "1")})): 16.0,
                ("vllm:prefix_cache_hits_total", frozenset({("engine", "0")})): 7.0,
            }

    assert serve.external_hit_tokens(Metrics()) == 2000.0


def test_goals_judged_from_numpy_ratios_can_be_written_as_json(serve):
    """vLLM's results carry numpy floats; a goal judged from them must still
    go into the --json file (the first full run died there, after 11 min)."""
    import numpy as np

    judged = serve.goals({"l1_on_over_l1_off": np.float64(2.78), "eic_default_over_l1_only": np.float64(1.2)})
    assert json.loads(json.dumps(judged)) == {"l1_on_over_l1_off": False, "eic_default_over_l1_only": True}


def test_a_third_pass_gets_its_own_rows_and_l1_on_ratios(serve):
    results = {
        "eic": {"pass1": _pass(9000), "pass2": _pass(300), "pass3": _pass(300), "wall_s": 1.0},
        "eic-default": {"pass1": _pass(9000), "pass2": _pass(900), "pass3": _pass(330), "wall_s": 1.0},
        "l1-only": {"pass1": _pass(9000), "pass2": _pass(200), "pass3": _pass(220), "wall_s": 1.0},
    }
    ratios = serve.ratios(results)
    assert ratios["l1_on_over_l1_off"] == pytest.approx(3.0)
    assert ratios["l1_on_over_l1_off_pass3"] == pytest.approx(1.1)
    assert ratios["eic_default_over_l1_only_pass3"] == pytest.approx(1.5)
    table = serve.table({"results": results, "ratios": ratios})
    assert table.count("| 3 |") == 3, table


def test_a_profiled_pass_is_summarised_under_the_table(serve):
    profile = {"mode": "cpu", "seconds": {"model forward": 40.0, "engine store (embedded EIC)": 12.5}, "total_s": 52.5}
    results = {"eic-default": {"pass1": _pass(9000), "pass2": {**_pass(900), "profile": profile}, "wall_s": 1.0}}
    table = serve.table({"results": results, "ratios": serve.ratios(results)})
    assert "eic-default (cpu): total 52.5: model forward 40.0, engine store (embedded EIC) 12.5" in table


def test_cpu_samples_are_charged_to_the_innermost_component():
    spec = importlib.util.spec_from_file_location("cpu_profile_under_test", REPO / "benchmarks" / "cpu_profile.py")
    cpu_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpu_profile)

    raw = "\n".join(
        [
            # the engine's copy, called by our connector, called by AIBrix: the engine's
            "run (threading.py:1) ;put (aibrix_kvcache/l2/l2_cache.py:5);mput (aibrix_eic/connector.py:9);_write (aibrix_eic/engine/shared_store.py:3);memmove (ctypes/__init__.py:2) 7",
            # the model's torch call: the model's; vLLM's loop around it: vLLM's
            "run (aibrix_kvcache/integration/vllm/kv_connector/__init__.py:7);forward (vllm/model_executor/models/llama.py:4);onednn_mm (vllm/_custom_ops.py:3);__call__ (torch/_ops.py:2) 5",
            "busy (vllm/v1/executor/x.py:1);acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:8);sched_yield (vllm/distributed/utils.py:4) 4",
            "step (vllm/v1/engine/core.py:1);schedule (vllm/v1/core/sched/scheduler.py:3) 2",
            # AIBrix's vLLM connector module lives under a 'vllm/' folder: still AIBrix's
            "step (vllm/v1/engine/core.py:1);start_load (aibrix_kvcache/integration/vllm/kv_connector/x.py:8) 3",
            "select (selectors.py:3) 1",
            # the e2e CPU adapter's copy, named bare (tests/e2e is on the server's path)
            "_recv_kv_sync_impl (aibrix_kvcache/integration/vllm/kv_connector/t1.py:9);run (cpu_adapt.py:54);onload (kv_layout.py:70) 6",
            # vLLM's tiered offloading: its fs tier's reads, its lookup thread, our tier inside it
            "_worker (vllm/v1/kv_offload/tiering/fs/thread_pool.py:5);read (vllm/v1/kv_offload/tiering/fs/io.py:9) 8",
            "_worker (vllm/v1/kv_offload/tiering/async_lookup.py:3) 9",
            "_worker (vllm/v1/kv_offload/tiering/async_lookup.py:3);batch_lookup (aibrix_eic/tier/manager.py:4) 10",
            "not a sample line",
        ]
    )
    assert cpu_profile.summarise(raw) == {
        "engine store (embedded EIC)": 7,
        "model forward": 5,
        "vLLM waiting for work (shm queue spin)": 4,
        "vLLM (scheduler, runner, API server)": 2,
        "AIBrix (cache manager, L1, connector)": 3,
        cpu_profile.OTHER: 1,
        "CPU adapter copies (test scaffolding)": 6,
        "vLLM fs tier": 8,
        "vLLM KV offloading (tiering, CPU primary)": 9,
        "aibrix_eic connector": 10,
    }
    # the step view keeps the worker's model step only
    step = "run (threading.py:1);execute_model (vllm/v1/worker/gpu_model_runner.py:2);result (concurrent/futures/_base.py:3) 9"
    assert cpu_profile.summarise(raw + "\n" + step, within=cpu_profile.STEP_FRAME) == {
        "vLLM (scheduler, runner, API server)": 9
    }


def test_pd_pressure_phase_cuts_only_the_decoders_kv_cache(serve, tmp_path):
    args = serve.parse_args(["--phases", "pd-pressure", "--decoder-blocks", "77"])
    prefill, decode = serve.phase_servers("pd-pressure", tmp_path / "model", tmp_path, args)
    assert "--num-gpu-blocks-override" not in prefill.argv
    assert decode.argv[decode.argv.index("--num-gpu-blocks-override") + 1] == "77"
    assert _kv_transfer(decode)["kv_role"] == "kv_consumer"
    assert "pd-pressure" not in serve.PHASES  # run only when named
