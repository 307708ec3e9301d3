"""Our Prometheus series on vLLM's own /metrics: with PROMETHEUS_MULTIPROC_DIR
set, vLLM's API server collects every process's series, and the TP worker's
aibrix_eic_* series move with an offload and a reload."""

import urllib.request

from conftest import FULL_REUSE, PROMPTS, start_server, stop_server, write_config
from prometheus_client.parser import text_string_to_metric_families
from server import ENGINE_BLOCK

REMOTE_URL = "local://metrics?seed=1"


def scrape(server) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def test_vllm_metrics_endpoint_shows_our_series_move(model_dir, workdir):
    multiproc_dir = workdir / "metrics-prometheus"
    multiproc_dir.mkdir(exist_ok=True)
    config = write_config(workdir, "metrics", f"remote_url: {REMOTE_URL}\neic_kv_ns: e2e-metrics\n")
    server = start_server(
        "metrics", model_dir, workdir,
        env={"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config), "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir)},
    )  # fmt: skip
    try:
        before = scrape(server)
        assert any(name.startswith("vllm:") for name, _ in before), "vLLM's own series are missing"
        hits_before = value(before, "aibrix_eic_blocks_total", op="get", outcome="hit", namespace="e2e-metrics")
        first = server.complete(PROMPTS["p1"])
        assert server.sent(first) == FULL_REUSE
        server.flushed_stats()  # the reload reads EIC, not the connector's pending writes
        again = server.complete(PROMPTS["p1"])
        assert server.reuse(again) == FULL_REUSE
        after = scrape(server)
        blocks = FULL_REUSE // ENGINE_BLOCK
        # AIBrix's cache blocks are not the engine's; count what moved.
        assert value(after, "aibrix_eic_blocks_total", op="put", outcome="ok", namespace="e2e-metrics") > 0
        hits = value(after, "aibrix_eic_blocks_total", op="get", outcome="hit", namespace="e2e-metrics") - hits_before
        assert hits > 0, f"no hits counted for a reload of {blocks} engine blocks"
        assert value(after, "aibrix_eic_requests_total", op="get", outcome="hit", namespace="e2e-metrics") >= 1
        # puts were written behind (the default put_mode), and no hit was served from a pending write
        accepted, served = (
            value(after, "aibrix_eic_write_behind_blocks_total", outcome=outcome, namespace="e2e-metrics")
            for outcome in ("accepted", "served")
        )
        assert accepted > 0 and served == 0, (accepted, served)
        assert value(after, "aibrix_eic_bytes_total", direction="in", namespace="e2e-metrics") > 0
        partitions = {dict(ls).get("partition") for (n, ls) in after if n == "aibrix_eic_breaker_open"}
        assert partitions and all(p.startswith("h0_1_l0_1") for p in partitions), partitions
        assert value(after, "aibrix_eic_breaker_open", namespace="e2e-metrics") == 0
    finally:
        stop_server(server)
