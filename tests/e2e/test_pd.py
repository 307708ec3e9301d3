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
import random
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
from model import VOCAB_SIZE
from pd_proxy import PDProxy
from server import ENGINE_BLOCK, Completion, Server, ServerError, complete, metric_value, pd_reuse_cpu

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


def _spec(name: str, kv_role: str, args: list[str] | None = None, **env: str):
    def spec(model_dir, workdir) -> dict:
        config = write_config(workdir, name, f"remote_url: {shared_store_url(workdir, STORE)}\n")
        metrics_dir = workdir / name / "prometheus"
        metrics_dir.mkdir(parents=True, exist_ok=True)
        return dict(
            name=name,
            model_dir=model_dir,
            workdir=workdir,
            kv_transfer=pd_reuse_cpu(kv_role, engine_id=name),
            args=args,
            env={
                "AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config),
                "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                **env,
            },
        )

    return spec


queue_server(__file__, "pd-prefill", _spec("pd-prefill", "kv_both", PYTHONHASHSEED="11"))
# A decoder KV cache of 130 blocks (4160 tokens): the other tests' requests
# fit in it (3 x 1000-token prompts at most), the preemption test's six
# 900 + 300-token requests do not.
DECODER_BLOCKS = 130
queue_server(
    __file__,
    "pd-decode",
    _spec("pd-decode", "kv_consumer", args=["--num-gpu-blocks-override", str(DECODER_BLOCKS)], PYTHONHASHSEED="12"),
)


def _tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(length)]


# The padding collision: AIBrix's PD connector pads a prompt's partial last
# block to a whole one with token id 0 and keys it by those tokens, so a
# prompt A and B = A + [0] * k (no longer than A rounded up to a block) got
# one key for that block. (len(A), k): B is decoded after A went through PD.
PADDED = [(998, 26), (40, 24), (500, 12), (998, 2)]
# B of whole blocks, sent to the decoder as a plain request: the connector's
# non-PD path reads B's last block (a shorter B, or one under its 256-token
# load threshold, is not read).
PADDED_PLAIN = [(998, 26), (500, 12)]
PAD_A = {f"pad{i}": _tokens(700 + i, n) for i, (n, _) in enumerate(PADDED)}
PAD_PLAIN_A = {f"padplain{i}": _tokens(720 + i, n) for i, (n, _) in enumerate(PADDED_PLAIN)}
# Controls: the same shapes, no A first; PROMPTS gets every B, so the
# baseline server computes them.
PROMPTS.update({f"{name}-b": a + [0] * k for (name, a), (_, k) in zip(PAD_A.items(), PADDED)})
PROMPTS.update({f"{name}-b": a + [0] * k for (name, a), (_, k) in zip(PAD_PLAIN_A.items(), PADDED_PLAIN)})
PROMPTS.update({f"padctl{i}-b": _tokens(740 + i, n) + [0] * k for i, (n, k) in enumerate(PADDED)})


class PD:
    def __init__(self, prefill: Server, decode: Server, proxy: PDProxy) -> None:
        self.prefill, self.decode, self.proxy = prefill, decode, proxy

    def complete(self, name: str, **extra) -> Completion:
        return self.complete_tokens(PROMPTS[name], **extra)

    def complete_tokens(self, prompt: list[int], **extra) -> Completion:
        return complete(self.proxy.url, prompt, who="pd proxy", **extra)

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
        # AIBrix's __init__ built the worker and ours adopted it: one cache manager, one open
        assert server.count_log(r"AIBrixPDReuseConnector is initialized") == 1
        assert server.count_log(open_line(url)) == 1


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


def test_a_prompt_padded_with_zeros_never_decodes_from_a_shorter_prompts_block(pd, baseline):
    """A, then B = A + [0] * k through the proxy: B's outputs are the
    baseline's and B's decoder loads all of B (what telling the two apart
    costs in reused tokens: nothing). On AIBrix's keys B's prefiller found
    A's padded block "existing" and B's decoder loaded it: wrong tokens."""
    for (name, a), (a_len, k) in zip(PAD_A.items(), PADDED):
        pd.complete_tokens(a)
        b = pd.complete_tokens(PROMPTS[f"{name}-b"])
        assert_same_output(b, baseline[f"{name}-b"], f"B = A({a_len}) + [0] * {k} after A", tol=PD_LOGPROB_TOL)
        assert pd.decode.reuse(b) == a_len + k, (a_len, k)


def test_a_plain_request_to_the_decoder_never_reads_a_padded_block(pd, baseline):
    """A through the proxy, then B = A + [0] * k (whole blocks) sent to the
    decoder as an ordinary request: the connector's non-PD path reads A's
    whole blocks and computes B's last one, which nothing stored."""
    for (name, a), (a_len, k) in zip(PAD_PLAIN_A.items(), PADDED_PLAIN):
        pd.complete_tokens(a)
        b = pd.decode.complete(PROMPTS[f"{name}-b"])
        assert_same_output(b, baseline[f"{name}-b"], f"plain B = A({a_len}) + [0] * {k} after A", tol=PD_LOGPROB_TOL)
        assert pd.decode.reuse(b) == a_len // ENGINE_BLOCK * ENGINE_BLOCK, (a_len, k)


def test_controls_of_the_padded_shapes_match_the_baseline(pd, baseline):
    for i, (a_len, k) in enumerate(PADDED):
        b = pd.complete_tokens(PROMPTS[f"padctl{i}-b"])
        assert_same_output(b, baseline[f"padctl{i}-b"], f"control A({a_len}) + [0] * {k}", tol=PD_LOGPROB_TOL)
        assert pd.decode.reuse(b) == a_len + k


PREEMPT_PROMPTS = [_tokens(760 + i, 900) for i in range(6)]
# Four prompts fill 116 of the 130 blocks; their outputs need a block each
# every 32 tokens, so vLLM preempts after about 124 tokens and resumes later.
PREEMPT_OUTPUT = 200


def _assert_same_until_a_tie(got: Completion, want: Completion, what: str) -> None:
    """Long greedy outputs: the tokens are the reference's and the logprobs
    within PD_LOGPROB_TOL, up to and including the first token where they
    part, if any, which must then be a tie (both picks as likely, within
    the tolerance): a resumed request recomputes its outputs in another
    batch shape, and this random model's cycles meet near-ties (measured:
    one part at token 182 of 300). KV that is not the prompt's moves the
    logprobs by far more (0.04 in the padding tests above)."""
    parted = next((i for i, (a, b) in enumerate(zip(got.token_ids, want.token_ids)) if a != b), len(want.token_ids))
    assert len(got.token_ids) == len(want.token_ids), what
    worst = max(abs(a - b) for a, b in zip(got.logprobs[: parted + 1], want.logprobs[: parted + 1]))
    assert worst <= PD_LOGPROB_TOL, f"{what}: logprobs differ by {worst} before token {parted}"


def test_preempted_decoder_requests_are_answered_and_the_decoder_stays_up(pd):
    """Six 900-token prompts asking 200 tokens each, at once: the 130-block
    decoder preempts some and resumes them. Every request answers with the
    tokens a server computing the prompts gives (the prefiller, as plain
    requests: nothing was stored for these prompts) and the decoder stays
    healthy. With AIBrix's scheduler a resumed request was loaded
    again and reported received while running: vLLM's scheduler asserted
    and the decoder's engine died."""
    with ThreadPoolExecutor(len(PREEMPT_PROMPTS)) as pool:
        want = list(pool.map(lambda p: pd.prefill.complete(p, max_tokens=PREEMPT_OUTPUT), PREEMPT_PROMPTS))
    assert all(pd.prefill.reuse(w) == 0 for w in want)
    preempted_before = metric_value(pd.decode.metrics(), "vllm:num_preemptions_total")

    def through_proxy(prompt: list[int]) -> Completion | ServerError:
        try:
            return pd.complete_tokens(prompt, max_tokens=PREEMPT_OUTPUT)
        except ServerError as e:
            return e

    with ThreadPoolExecutor(len(PREEMPT_PROMPTS)) as pool:
        outs = list(pool.map(through_proxy, PREEMPT_PROMPTS))
    assert pd.decode.healthy(), f"the decoder died:\n{pd.decode.tail()}"
    failed = [out for out in outs if isinstance(out, ServerError)]
    assert not failed, failed
    for i, (out, ref) in enumerate(zip(outs, want)):
        _assert_same_until_a_tie(out, ref, f"preemption prompt {i}")
    preempted = metric_value(pd.decode.metrics(), "vllm:num_preemptions_total") - preempted_before
    assert preempted > 0, "the decoder preempted nothing: the test did not test preemption"


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
