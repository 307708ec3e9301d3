"""Faults injected through the engine's seeded knobs, with our package reached
through the .pth hook alone (vLLM's entry point filtered out).

The server starts with EIC unreachable: it must start (fail-open), log the
open breaker in vLLM's format and serve without reuse. Then EIC comes back
(the breaker closes) and turns flaky: failed calls, failed keys and latency.
Every request must succeed with the baseline's outputs, and reuse may only
shrink to a shorter prefix.

`aibrix-eic status`, reading the server's /metrics (and the workers'
multiprocess directory) as an operator would, tells each stage apart by
its exit status: store unreachable (breaker open), healthy, store failing.
"""

import json
import subprocess
import sys
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
from server import ENGINE_BLOCK, MODEL_NAME

REMOTE_URL = "local://faults?seed=7"
FLAKY = "fail_rate=0.2&key_fail_rate=0.1&latency=2ms&seed=7"


def _spec(model_dir, workdir) -> dict:
    config = write_config(workdir, "faults", f"remote_url: {REMOTE_URL}\nprobe_interval_s: 0.5\n")
    metrics_dir = workdir / "faults" / "prometheus"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),  # the workers' series on vLLM's /metrics
        "AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config),
        "VLLM_PLUGINS": "lora_filesystem_resolver",  # every general plugin but ours
        # unreachable before the connector opens; a probe command lifts it
        "E2E_PROBE_AT_START": '{"store": "faults", "params": "unreachable=true"}',
    }
    return dict(name="faults", model_dir=model_dir, workdir=workdir, env=env)


queue_server(__file__, "faults", _spec)


# aibrix-eic status's exit statuses (docs/cli.md)
HEALTHY, DEGRADED, DOWN = 0, 1, 3


def status_command(server, *args: str) -> list[str]:
    return [sys.executable, "-m", "aibrix_eic", "status", f"{server.url}/metrics", "--json", *args]


def status(server, *args: str) -> tuple[int, dict]:
    """`aibrix-eic status` on the server: its exit status and JSON report."""
    run = subprocess.run(status_command(server, *args), capture_output=True, text=True, timeout=60)
    assert run.stdout, run.stderr
    return run.returncode, json.loads(run.stdout)


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
    code, report = status(server, "--interval", "0")
    assert code == DOWN, report
    (rank,) = report["ranks"]
    assert rank["state"] == "breaker open" and rank["fast_fails"] > 0 and rank["identity"], rank


def test_recovers_then_survives_seeded_faults(server, baseline):
    server.probe("reachable", {"params": "unreachable=false"})
    (match,) = server.wait_log(VLLM_PREFIX + r"EIC circuit CLOSED for local://faults")
    assert match["level"] == "WARNING"
    code, report = status(server, "--interval", "1")  # the breaker's trip is before the window
    assert code == HEALTHY and report["ranks"][0]["state"] == "open", report
    code, on_pod = status(server, "--multiproc-dir", str(server.env["PROMETHEUS_MULTIPROC_DIR"]), "--interval", "0")
    assert [r["partition"] for r in on_pod["ranks"]] == [r["partition"] for r in report["ranks"]], on_pod
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
    # vLLM's own counters, as status reads them: vLLM asked the connector,
    # and counts none of the reuse above, since AIBrix's Type1 loads inside
    # the model step and tells the scheduler 0 matched tokens
    # (docs/quickstart.md says so next to vLLM's log line)
    _, report = status(server, "--interval", "0")
    assert report["vllm_model"] == MODEL_NAME and report["vllm_queried_tokens"] > 0, report
    assert report["vllm_reused_tokens"] == 0 and report["ranks"][0]["hit_blocks"] > 0, report


def test_status_tells_a_failing_store_as_degraded(server, baseline):
    """Every key fails while whole calls succeed (so the breaker stays
    closed): the requests in the status's window fail. `--watch`: its first
    report comes once it has read the page, so the request is sent inside
    the second report's window."""
    server.probe("failing", {"params": "fail_rate=0&key_fail_rate=1.0&latency=0ms"})
    watcher = subprocess.Popen(
        status_command(server, "--watch", "8", "--count", "2"), stdout=subprocess.PIPE, text=True
    )
    try:
        assert watcher.stdout is not None
        first = watcher.stdout.readline()
        assert json.loads(first)["window_s"] is None, first  # since start: the flaky phase's failures too
        out = server.complete(PROMPTS["p4"])
        assert_same_output(out, baseline["p4"], "p4 with every key failing")
        rest, _ = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    report = json.loads(rest.splitlines()[-1])
    assert watcher.returncode == DEGRADED, rest
    (rank,) = report["ranks"]
    assert rank["state"] == "open" and rank["error_rate"] > 0.05 and report["window_s"] > 0, rank
