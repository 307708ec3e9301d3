"""AIBrix's L1 on, in front of our L2; our package reached through vLLM's
entry point alone (the .pth hook disabled).

L1 is small (about two prompts' KV) and ingests ALL puts into L2, so a
reload of a prompt still in L1 does not touch L2, and a reload after other
prompts evicted it from L1 must come from our L2.
"""

import time

import pytest
from conftest import (
    FULL_REUSE,
    PROMPTS,
    assert_same_output,
    claim_server,
    open_line,
    queue_server,
    stop_server,
    write_config,
)
from server import ENGINE_BLOCK, ServerError

REMOTE_URL = "local://l1on?seed=2"
BLOCKS = FULL_REUSE // ENGINE_BLOCK


def _spec(model_dir, workdir) -> dict:
    config = write_config(workdir, "l1on", f"remote_url: {REMOTE_URL}\n")
    env = {
        "AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config),
        "AIBRIX_EIC_DISABLE_AUTOLOAD": "1",  # entry point only
        "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED": "1",
        "AIBRIX_KV_CACHE_OL_L1_CACHE_CAPACITY_GB": "0.002",  # ~2 MiB; a prompt's KV is ~1 MiB
        "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE": "ALL",
    }
    return dict(name="l1on", model_dir=model_dir, workdir=workdir, env=env)


queue_server(__file__, "l1on", _spec)


@pytest.fixture(scope="module")
def server(model_dir, workdir, baseline):
    server = claim_server("l1on", model_dir, workdir)
    yield server
    stop_server(server)


def _store(server) -> dict:
    (snapshot,) = server.fresh_stats().values()
    return snapshot["stores"]["l1on"]


def _wait_keys(server, keys: int, timeout_s: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        store = _store(server)
        if store["keys"] >= keys or time.monotonic() > deadline:
            return store
        time.sleep(0.3)


def test_entry_point_alone_installs_our_connector(server):
    (match,) = server.wait_log(open_line(REMOTE_URL))
    assert match["level"] == "INFO"
    assert server.env["AIBRIX_EIC_DISABLE_AUTOLOAD"] == "1"


def test_l2_receives_blocks_and_serves_reloads_after_l1_eviction(server, baseline):
    first = server.complete(PROMPTS["p0"])
    assert_same_output(first, baseline["p0"], "first send")
    assert server.sent(first) == FULL_REUSE
    store = _wait_keys(server, BLOCKS)
    assert store["keys"] == BLOCKS, f"ingestion ALL: L2 should hold every block, has {store}"

    # other prompts push p0 out of the small L1 (S3FIFO drops one-hit
    # entries first, so p0 is not read again before)
    for name in ("p1", "p2", "p3", "p4"):
        assert_same_output(server.complete(PROMPTS[name]), baseline[name], name)
    store = _wait_keys(server, 5 * BLOCKS)
    assert store["keys"] == 5 * BLOCKS, store

    hits_before = store["hits"]
    from_l2 = server.complete(PROMPTS["p0"])
    assert server.reuse(from_l2) == FULL_REUSE
    assert_same_output(from_l2, baseline["p0"], "reload after L1 eviction")
    hits = _store(server)["hits"] - hits_before
    assert hits == BLOCKS, f"the reload after eviction read {hits} blocks from L2, expected {BLOCKS}"

    # the latest prompt is still in L1: reused without reading our L2
    hits_before = _store(server)["hits"]
    from_l1 = server.complete(PROMPTS["p4"])
    assert server.reuse(from_l1) == FULL_REUSE
    assert_same_output(from_l1, baseline["p4"], "L1 reload")
    assert _store(server)["hits"] == hits_before, "a reload that L1 could serve read L2"


def test_server_still_healthy(server):
    if not server.healthy():
        raise ServerError(f"unhealthy\n{server.tail()}")
