"""EIC as a secondary tier of vLLM's own KV offloading, in real servers:
vLLM's OffloadingConnector (CPU copies by cpu_tiering.py) with
`TieringOffloadingSpec`, a CPU primary tier and our `EICSecondaryTier`,
two replicas on one shared embedded store, prefix caching off.

A replica's own reloads come from its CPU primary tier; what the other
replica wrote can only come from EIC, so the cross-replica reads are the
tier's reads (the store's hit counts say so, and a poisoned store changes
their output).
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import (
    FULL_REUSE,
    PROMPTS,
    assert_same_output,
    shared_store_url,
    start_servers,
    stop_server,
    store_stats,
)
from server import ENGINE_BLOCK, Server

STORE = "tier"
FULL_BLOCKS = FULL_REUSE // ENGINE_BLOCK
STORED_WITHIN_S = 30.0
TIER_LABEL = "1:EICSecondaryTier"  # vLLM's `tier` label: position among the secondary tiers, then type
TIER = {"type": "EICSecondaryTier", "module_path": "aibrix_eic.tier.manager"}


def tiering(remote_url: str) -> dict:
    return {
        "kv_connector": "CPUOffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_module_path": "cpu_tiering",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 16 << 20,
            "secondary_tiers": [dict(TIER, remote_url=remote_url, get_timeout_ms=1000, exists_timeout_ms=300)],
        },
    }


def _spec(name: str, model_dir, workdir, remote_url: str) -> dict:
    kv = tiering(remote_url)
    # connector=False: none of AIBrix's settings; the tiering config goes in as vLLM's flag
    return dict(
        name=name, model_dir=model_dir, workdir=workdir, connector=False, args=["--kv-transfer-config", json.dumps(kv)]
    )


@pytest.fixture(scope="module")
def replicas(model_dir, workdir, baseline):
    url = shared_store_url(workdir, STORE)
    servers = start_servers(_spec("tier-a", model_dir, workdir, url), _spec("tier-b", model_dir, workdir, url))
    yield servers
    stop_server(*servers)


def hits(server: Server) -> int:
    return store_stats(server, STORE)["hits"]


def test_the_tier_logs_in_vllms_log(replicas):
    a, _ = replicas
    (match,) = a.wait_log(
        r"\(EngineCore pid=\d+\) INFO .*EIC secondary tier 'EICSecondaryTier': remote_url=local://tier"
    )
    assert "Created TieringOffloadingManager with primary tier" in a.log()


def test_offload_then_reload_gives_the_baseline(replicas, baseline):
    a, _ = replicas
    first = a.complete(PROMPTS["p0"])
    assert_same_output(first, baseline["p0"], "first send")
    stats = store_stats(a, STORE)
    assert stats["keys"] >= FULL_BLOCKS, stats  # every full block cascaded to EIC
    again = a.complete(PROMPTS["p0"])
    assert_same_output(again, baseline["p0"], "reload")


def test_a_second_replica_reuses_the_first_replicas_kv(replicas, baseline):
    a, b = replicas
    sent_and_stored(a, PROMPTS["p1"])
    before = hits(b)
    reload = b.complete(PROMPTS["p1"])
    read = hits(b) - before
    assert read >= 0.95 * FULL_BLOCKS, f"{read} of {FULL_BLOCKS} full blocks read from EIC"
    assert_same_output(reload, baseline["p1"], "the second replica's reload")
    assert tier_read_bytes(b) > 0, "vLLM's per-tier series on /metrics show no read from our tier"


def tier_read_bytes(server: Server) -> float:
    """vLLM's own kv_offload_tiering_read_bytes for our tier, from /metrics
    (vLLM publishes its stats every few seconds: polled, bounded)."""
    deadline = time.monotonic() + STORED_WITHIN_S
    while True:
        value = sum(
            v
            for (name, labels), v in server.metrics().items()
            if name.startswith("vllm:kv_offload_tiering_read_bytes") and dict(labels).get("tier") == TIER_LABEL
        )
        if value > 0 or time.monotonic() >= deadline:
            return value
        time.sleep(0.5)


def test_a_poisoned_store_changes_what_the_other_replica_reads(replicas, baseline):
    a, b = replicas
    sent_and_stored(a, PROMPTS["p2"])
    (result,) = a.probe("corrupt-tier", {"corrupt": True})
    assert "corrupted" in result[STORE]
    poisoned = b.complete(PROMPTS["p2"])
    assert (
        poisoned.token_ids != baseline["p2"].token_ids
        or max(abs(x - y) for x, y in zip(poisoned.logprobs, baseline["p2"].logprobs)) > 1.0
    ), "equal outputs from poisoned KV: the reads did not come from EIC"


def test_a_store_outage_is_answered_by_recomputation(replicas, baseline):
    _, b = replicas
    b.probe("outage", {"params": "unreachable=true"})
    try:
        names = ["p3", "p4", "p5"]
        with ThreadPoolExecutor(len(names)) as pool:
            outs = list(pool.map(lambda n: b.complete(PROMPTS[n]), names))  # raises on any failed request
        for name, out in zip(names, outs):
            assert_same_output(out, baseline[name], f"{name} during the outage")
        assert b.healthy()
    finally:
        b.probe("healed", {"params": "unreachable=false"})


def sent_and_stored(server: Server, prompt: list[int]) -> None:
    """Send a prompt and wait until its full blocks are in EIC: the tier's
    store jobs run after the request returned."""
    keys = store_stats(server, STORE)["keys"]
    server.complete(prompt)
    deadline = time.monotonic() + STORED_WITHIN_S
    while (now := store_stats(server, STORE)["keys"]) < keys + FULL_BLOCKS:
        assert time.monotonic() < deadline, f"{now - keys} of {FULL_BLOCKS} blocks stored after {STORED_WITHIN_S}s"
