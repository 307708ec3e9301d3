"""Disaggregated prefill/decode through EIC: our PD connector
(aibrix_eic.pd.connector: AIBrix's AIBrixPDReuseConnector with the decoder's
failed loads reported to vLLM) on a prefill server (kv_both) and a decode
server (kv_consumer, kv_load_failure_policy recompute), both on one
shared engine store (`local://pd?dir=...`), behind a test-owned proxy that
does what a PD router does (pd_proxy.py): prefill with `do_remote_decode`
and one token, then decode with the `kv_transfer_params` the prefiller
returned. The prefiller's connector writes the prompt's KV through our L2,
the decoder's connector reads it from there: EIC is the P->D medium.
"""

import importlib.util
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import (
    PROMPT_LEN,
    PROMPTS,
    REPO,
    assert_same_output,
    claim_server,
    open_line,
    queue_server,
    shared_store_url,
    stop_server,
    write_config,
)
from pd_proxy import PDProxy
from server import ENGINE_BLOCK, Completion, Server, complete, metric_value, pd_reuse_cpu

STORE = "pd"
# The prefiller writes the whole prompt, its last block padded; the decoder
# loads all of it (AIBrix's `reused` counts prompt tokens, not the padding).
PROMPT_BLOCKS = math.ceil(PROMPT_LEN / ENGINE_BLOCK)
# The decoder computes the prompt's last token alone, attending to the 999
# loaded ones; the colocated server computed all 1000 in one prefill. Same
# KV bytes, another summation order: token ids equal, logprobs within 3.5e-4
# measured (KV that is not the prompt's changes the tokens themselves, see
# the eviction test).
PD_LOGPROB_TOL = 1e-3


def _spec(name: str, kv_role: str, **env: str):
    def spec(model_dir, workdir) -> dict:
        config = write_config(workdir, name, f"remote_url: {shared_store_url(workdir, STORE)}\n")
        metrics_dir = workdir / name / "prometheus"
        metrics_dir.mkdir(parents=True, exist_ok=True)
        return dict(
            name=name,
            model_dir=model_dir,
            workdir=workdir,
            kv_transfer=pd_reuse_cpu(kv_role, engine_id=name),
            env={
                "AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config),
                "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                **env,
            },
        )

    return spec


queue_server(__file__, "pd-prefill", _spec("pd-prefill", "kv_both", PYTHONHASHSEED="11"))
queue_server(__file__, "pd-decode", _spec("pd-decode", "kv_consumer", PYTHONHASHSEED="12"))


class PD:
    def __init__(self, prefill: Server, decode: Server, proxy: PDProxy) -> None:
        self.prefill, self.decode, self.proxy = prefill, decode, proxy

    def complete(self, name: str, **extra) -> Completion:
        return complete(self.proxy.url, PROMPTS[name], who="pd proxy", **extra)

    def sent_by_prefiller(self) -> int:
        """Tokens AIBrix's prefiller connector reports written for the proxy's latest prefill."""
        step = self.proxy.history[-1]
        return sum(self.prefill.counts(Completion(step.prefill_id, [], []), "sent"))


@pytest.fixture(scope="module")
def pd(model_dir, workdir, baseline):
    prefill = claim_server("pd-prefill", model_dir, workdir)
    decode = claim_server("pd-decode", model_dir, workdir)
    proxy = PDProxy(prefill.url, decode.url).start()
    yield PD(prefill, decode, proxy)
    proxy.stop()
    stop_server(prefill, decode)


def _hits(server: Server) -> int:
    return sum(s["stores"][STORE]["hits"] for s in server.fresh_stats().values())


def _prompt_tokens(samples: dict, source: str) -> float:
    return metric_value(samples, "vllm:prompt_tokens_by_source_total", source=source)


def test_both_servers_open_the_shared_store(pd, workdir):
    url = shared_store_url(workdir, STORE)
    for server in (pd.prefill, pd.decode):
        server.wait_log(open_line(url))
        server.wait_log(r"AIBrixPDReuseConnector is initialized")


def test_decoder_loads_the_prompt_from_eic_and_matches_a_colocated_server(pd, baseline):
    before, hits_before = pd.decode.metrics(), _hits(pd.decode)
    out = pd.complete("p0")
    step = pd.proxy.history[-1]
    assert step.kv_transfer_params and step.kv_transfer_params["do_remote_prefill"] is True, step.kv_transfer_params
    # the prefiller wrote the whole prompt (its last block padded) through our L2
    assert pd.sent_by_prefiller() >= PROMPT_LEN
    # the decoder's tokens and logprobs are the colocated server's
    assert_same_output(out, baseline["p0"], "decoder behind the proxy", tol=PD_LOGPROB_TOL)
    # it loaded every prompt token from EIC ...
    assert pd.decode.reuse(out) == PROMPT_LEN
    assert _hits(pd.decode) - hits_before == PROMPT_BLOCKS
    after = pd.decode.metrics()
    got = metric_value(after, "aibrix_eic_blocks_total", op="get", outcome="hit") - metric_value(
        before, "aibrix_eic_blocks_total", op="get", outcome="hit"
    )
    assert got == PROMPT_BLOCKS, f"the decoder's /metrics counted {got} blocks read from EIC"
    # ... and vLLM counts none of it computed: all external (what the
    # connector claimed; the last token, which vLLM runs again to sample the
    # first output token, is not counted). Our series above and AIBrix's
    # line are what was loaded: vLLM's would read the same after a failed load.
    assert _prompt_tokens(after, "local_compute") - _prompt_tokens(before, "local_compute") == 0
    assert _prompt_tokens(after, "external_kv_transfer") - _prompt_tokens(before, "external_kv_transfer") == (
        PROMPT_LEN
    )


def test_concurrent_requests_through_the_proxy(pd, baseline):
    names = ["p1", "p2", "p3"]
    with ThreadPoolExecutor(len(names)) as pool:
        outs = list(pool.map(pd.complete, names))
    for name, out in zip(names, outs):
        assert_same_output(out, baseline[name], f"{name} behind the proxy", tol=PD_LOGPROB_TOL)
        assert pd.decode.reuse(out) == PROMPT_LEN, name


def _serve_bench():
    spec = importlib.util.spec_from_file_location("serve_bench", REPO / "benchmarks" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vllm_serving_benchmark_client_through_the_proxy_fails_nothing(pd, model_dir):
    """A short run of vLLM's own serving-benchmark client (streamed
    completions, requests overlapping) against the proxy, as
    benchmarks/serve.py drives it."""
    serve = _serve_bench()
    from vllm.benchmarks.serve import main as vllm_bench_main

    workload = "--prompts 6 --prompt-len 600 --output-len 6 --request-rate inf --max-concurrency 3"
    args = serve.parse_args(workload.split())
    result = vllm_bench_main(serve.bench_args(pd.proxy.url, model_dir, args))
    assert result["failed"] == 0 and result["completed"] == 6, result.get("errors")
    assert len(pd.proxy.history) >= 6


def _decode_after_prefill(pd: PD, name: str, between) -> Completion:
    """The proxy's two steps by hand, with `between` run in between."""
    step = pd.proxy.prefill({"model": "e2e", "prompt": PROMPTS[name], "max_tokens": 8})
    assert step.kv_transfer_params, "the prefiller returned no transfer parameters"
    between()
    return pd.decode.complete(PROMPTS[name], kv_transfer_params=step.kv_transfer_params)


def _recomputed(pd: PD, out: Completion, want: Completion, what: str, recoveries_before: int) -> None:
    """The decoder's answer to a prompt whose KV it could not load: computed
    by the decoder, the colocated server's tokens and logprobs. AIBrix's own
    PD connector answered these from KV it never loaded."""
    assert pd.decode.reuse(out) == 0  # our L2 answered the miss: nothing was loaded
    assert_same_output(out, want, what)
    # vLLM heard of the failed load from the connector and rescheduled the request
    pd.decode.wait_log(RECOVERED, count=recoveries_before + 1)


RECOVERED = r"Recovered from KV load failure"


# Last: the faults below leave the decoder's breaker open for a while.
def test_kv_evicted_before_the_decoder_reads_it_is_recomputed(pd, baseline):
    before = pd.decode.count_log(RECOVERED)
    out = _decode_after_prefill(pd, "p4", lambda: pd.decode.probe("evict", {"clear": True}))
    _recomputed(pd, out, baseline["p4"], "decoder after the prompt's KV was evicted", before)


def test_store_down_when_the_decoder_reads_is_recomputed(pd, baseline):
    before = pd.decode.count_log(RECOVERED)
    try:
        out = _decode_after_prefill(pd, "p5", lambda: pd.decode.probe("down", {"params": "unreachable=true"}))
    finally:
        pd.decode.probe("up", {"params": "unreachable=false"})
    _recomputed(pd, out, baseline["p5"], "decoder with the store down", before)
