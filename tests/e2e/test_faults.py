"""Faults injected through the engine's seeded knobs, with our package reached
through the .pth hook alone (vLLM's entry point filtered out).

The server starts with EIC unreachable: it must start (fail-open), log the
open breaker in vLLM's format and serve without reuse. Then EIC comes back
(the breaker closes) and turns flaky: failed calls, failed keys and latency.
Every request must succeed with the baseline's outputs, and reuse may only
shrink to a shorter prefix.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import (
    FULL_REUSE,
    PROMPTS,
    VLLM_PREFIX,
    assert_same_output,
    claim_server,
    open_line,
    queue_server,
    stop_server,
    write_config,
)
from server import ENGINE_BLOCK

REMOTE_URL = "local://faults?seed=7"
FLAKY = "fail_rate=0.2&key_fail_rate=0.1&latency=2ms&seed=7"


def _spec(model_dir, workdir) -> dict:
    config = write_config(workdir, "faults", f"remote_url: {REMOTE_URL}\nprobe_interval_s: 0.5\n")
    env = {
        "AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config),
        "VLLM_PLUGINS": "lora_filesystem_resolver",  # every general plugin but ours
        # unreachable before the connector opens; a probe command lifts it
        "E2E_PROBE_AT_START": '{"store": "faults", "params": "unreachable=true"}',
    }
    return dict(name="faults", model_dir=model_dir, workdir=workdir, env=env)


queue_server(__file__, "faults", _spec)


@pytest.fixture(scope="module")
def server(model_dir, workdir, baseline):
    server = claim_server("faults", model_dir, workdir)
    yield server
    stop_server(server)


def test_pth_hook_alone_installs_our_connector(server):
    (match,) = server.wait_log(open_line(REMOTE_URL))
    assert "connected=False" in server.log()[match.end() :].splitlines()[0]


def test_unreachable_at_start_serves_without_reuse(server, baseline):
    (match,) = server.wait_log(VLLM_PREFIX + r"EIC circuit OPEN for local://faults")
    assert match["level"] == "WARNING"
    for attempt in range(2):
        out = server.complete(PROMPTS["p0"])
        assert_same_output(out, baseline["p0"], f"attempt {attempt}")
        assert server.reuse(out) == 0
    assert server.healthy()


def test_recovers_then_survives_seeded_faults(server, baseline):
    server.probe("reachable", {"params": "unreachable=false"})
    (match,) = server.wait_log(VLLM_PREFIX + r"EIC circuit CLOSED for local://faults")
    assert match["level"] == "WARNING"
    server.probe("flaky", {"params": FLAKY})

    reloads = []
    for name in ("p1", "p2", "p3"):
        for attempt in range(3):
            out = server.complete(PROMPTS[name])
            assert_same_output(out, baseline[name], f"{name} sequential {attempt}")
            reloads.append(server.reuse_after(out))
    names = ["p1", "p2", "p3", "p4", "p5"] * 2
    with ThreadPoolExecutor(5) as pool:
        outs = list(pool.map(lambda n: server.complete(PROMPTS[n]), names))
    for name, out in zip(names, outs):
        assert_same_output(out, baseline[name], f"{name} concurrent")
        reloads.append(server.reuse_after(out))

    for computed, reused in reloads:
        # a reuse is whole blocks of the stored prefix, never past it
        assert (computed + reused) % ENGINE_BLOCK == 0 and computed + reused <= FULL_REUSE, (computed, reused)
    assert any(reused for _, reused in reloads), "no request reused anything: the faults test saw no reload"
    # our rate-limited failure lines reach vLLM's log, formatted, naming their caller
    (failure, *_) = server.wait_log(VLLM_PREFIX + r"EIC call failed: ")
    assert "[logs.py:" not in failure[0]
    assert server.healthy()
    (snapshot,) = server.fresh_stats().values()
    assert snapshot["stores"]["faults"]["hits"] > 0
