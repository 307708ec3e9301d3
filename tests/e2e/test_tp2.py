"""Tensor parallel 2: each worker opens its own connector on its own
partition of the KV heads, and reloads through both give right outputs."""

import pytest
from conftest import FULL_REUSE, PROMPTS, assert_same_output, open_line, start_server, stop_server, write_config
from server import ENGINE_BLOCK

REMOTE_URL = "local://tp2?seed=3"


@pytest.fixture(scope="module")
def server(model_dir, workdir, baseline):
    config = write_config(workdir, "tp2", f"remote_url: {REMOTE_URL}\n")
    server = start_server(
        "tp2",
        model_dir,
        workdir,
        # one core per rank: vLLM's automatic binding wants a NUMA node per rank
        env={"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config), "VLLM_CPU_OMP_THREADS_BIND": "0|1"},
        args=["--tensor-parallel-size", "2"],
    )
    yield server
    stop_server(server)


def test_each_worker_opens_its_own_partition(server):
    matches = server.wait_log(open_line(REMOTE_URL), count=2)
    assert len(matches) == 2, [m[0] for m in matches]
    assert len({m["pid"] for m in matches}) == 2, "both connectors opened in one process"
    # 2 kv heads over 2 ranks: one head each, both layers
    assert sorted(m["conn_id"].split("_l")[0] for m in matches) == ["aibrix_h0_0", "aibrix_h1_1"]
    assert {m["proc"] for m in matches} == {"Worker_TP0", "Worker_TP1"}


def test_reloads_through_both_workers_match_baseline(server, baseline):
    for name in ("p0", "p1"):
        first = server.complete(PROMPTS[name])
        assert_same_output(first, baseline[name], f"{name} first")
        server.flushed_stats()  # the reload reads EIC, not the connector's pending writes
        again = server.complete(PROMPTS[name])
        assert server.counts(again, "reused") == [FULL_REUSE, FULL_REUSE], name  # one line per rank
        assert_same_output(again, baseline[name], f"{name} reload")
    stats = server.flushed_stats()
    assert len(stats) == 2, f"expected one engine store per worker process: {stats}"
    for pid, snapshot in stats.items():
        store = snapshot["stores"]["tp2"]
        # each worker stored its own half-head blocks of both prompts, and read them back
        assert store["keys"] == 2 * FULL_REUSE // ENGINE_BLOCK, (pid, store)
        assert store["hits"] >= 2 * FULL_REUSE // ENGINE_BLOCK, (pid, store)
