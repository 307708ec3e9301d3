"""Offload then reload through our L2, vLLM prefix caching off, AIBrix L1 off.

One server, both install routes active (.pth hook and entry point), the
embedded engine as EIC. Every reload must come from our L2, report the
expected reused tokens, and give the baseline's outputs.
"""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import (
    FULL_REUSE,
    PROMPTS,
    VLLM_PREFIX,
    assert_fork_reuses_shared_blocks,
    assert_poisoned_reload_differs,
    assert_same_output,
    claim_server,
    first_send,
    open_line,
    queue_server,
    stop_server,
    write_config,
)
from server import ENGINE_BLOCK

REMOTE_URL = "local://l1off?seed=1"


def _spec(model_dir, workdir) -> dict:
    config = write_config(workdir, "l1off", f"remote_url: {REMOTE_URL}\n")
    return dict(name="l1off", model_dir=model_dir, workdir=workdir, env={"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config)})


queue_server(__file__, "l1off", _spec)


@pytest.fixture(scope="module")
def server(model_dir, workdir, baseline):
    server = claim_server("l1off", model_dir, workdir)
    yield server
    stop_server(server)


def test_worker_log_shows_our_connector_in_vllms_format(server):
    (match,) = server.wait_log(open_line(REMOTE_URL))
    assert match["proc"] == "Worker" and match["level"] == "INFO"
    assert match["conn_id"].startswith("aibrix_h0_1_l0_1_"), match["conn_id"]  # 2 kv heads, 2 layers
    # and only there: no second, unformatted copy through the root logger
    assert len(re.findall(r"EIC connector open", server.log())) == 1


def test_first_send_offloads_then_reloads_reuse_it(server, baseline):
    prompt = PROMPTS["p0"]
    first_send(server, "p0", baseline)
    stats = server.flushed_stats()
    (snapshot,) = stats.values()
    assert snapshot["stores"]["l1off"]["keys"] == FULL_REUSE // ENGINE_BLOCK
    hits_before = snapshot["stores"]["l1off"]["hits"]

    for attempt in range(2):
        again = server.complete(prompt)
        assert server.reuse(again) == FULL_REUSE, f"reload {attempt}"
        assert server.sent(again, timeout_s=0.5) == 0  # nothing new to send
        assert_same_output(again, baseline["p0"], f"reload {attempt}")
    (snapshot,) = server.fresh_stats().values()
    assert snapshot["stores"]["l1off"]["hits"] - hits_before == 2 * FULL_REUSE // ENGINE_BLOCK


def test_a_shared_prefix_reuses_only_the_shared_blocks(server, baseline):
    server.complete(PROMPTS["p0"])  # stored by the test above, or now
    assert_fork_reuses_shared_blocks(server, baseline)


def test_concurrent_requests_offload_and_reload(server, baseline):
    names = ["p1", "p2", "p3", "p4"]
    with ThreadPoolExecutor(len(names)) as pool:
        firsts = list(pool.map(lambda n: server.complete(PROMPTS[n]), names))
        agains = list(pool.map(lambda n: server.complete(PROMPTS[n]), names))
    full_reloads = 0
    for name, first, again in zip(names, firsts, agains):
        assert_same_output(first, baseline[name], f"{name} first")
        assert_same_output(again, baseline[name], f"{name} reload")
        computed, reused = server.reuse_after(again)
        # the scheduler may prefill a few tokens of a request before its
        # reload; the reload then covers the rest of the stored blocks
        assert reused == 0 or computed + reused == FULL_REUSE, (name, computed, reused)
        full_reloads += reused > 0
    assert full_reloads >= len(names) // 2, full_reloads
    assert server.healthy()


def test_reloaded_kv_really_comes_from_our_store(server, baseline):
    """Last in this module: overwrite every stored block through the engine;
    the next reload must then give different outputs. So the equal outputs
    above were computed from the KV our L2 returned, not recomputed."""
    assert_poisoned_reload_differs(server, baseline, "l1off")
    assert re.search(VLLM_PREFIX, server.log(), re.MULTILINE)
