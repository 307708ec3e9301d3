"""Tensor parallel 2: each worker opens its own connector on its own
partition of the KV heads, and reloads through both give right outputs.

Both servers here use one shared engine store and `model_id`; the second is
a TP=2 replica that mounts the weights under another path and reuses each
rank's share of what the first one stored (test_cross_engine.py has the
TP=1 cases, and the other mount path without model_id sharing nothing).
"""

import pytest
from conftest import (
    FULL_REUSE,
    PROMPTS,
    assert_same_output,
    claim_server,
    identity_token,
    open_line,
    queue_server,
    shared_store_url,
    start_server,
    stop_server,
    write_config,
)
from server import ENGINE_BLOCK

STORE = "tp2"
MODEL_ID = "e2e-tiny"
BLOCKS = FULL_REUSE // ENGINE_BLOCK


@pytest.fixture(scope="module")
def url(workdir) -> str:
    return shared_store_url(workdir, STORE)


def _spec(name, model_dir, workdir, hash_seed: int) -> dict:
    config = write_config(workdir, name, f"remote_url: {shared_store_url(workdir, STORE)}\nmodel_id: {MODEL_ID}\n")
    env = {
        "AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config),
        # one core per rank: vLLM's automatic binding wants a NUMA node per rank
        "VLLM_CPU_OMP_THREADS_BIND": "0|1",
        "PYTHONHASHSEED": str(hash_seed),
    }
    return dict(name=name, model_dir=model_dir, workdir=workdir, env=env, args=["--tensor-parallel-size", "2"])


queue_server(__file__, "tp2", lambda model_dir, workdir: _spec("tp2", model_dir, workdir, hash_seed=1))


@pytest.fixture(scope="module")
def server(model_dir, workdir, baseline):
    server = claim_server("tp2", model_dir, workdir)
    yield server
    stop_server(server)


def test_each_worker_opens_its_own_partition(server, url):
    matches = server.wait_log(open_line(url), count=2)
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
    assert len(stats) == 2, f"expected the store open in both worker processes: {stats}"
    for pid, snapshot in stats.items():
        store = snapshot["stores"][STORE]
        # one store: both workers' half-head blocks of both prompts
        assert store["keys"] == 2 * 2 * BLOCKS, (pid, store)
        # each worker read its own half back
        assert store["hits"] >= 2 * BLOCKS, (pid, store)


def test_a_replica_at_another_mount_reuses_each_ranks_share(server, model_dir, second_mount, workdir, url, baseline):
    """A second TP=2 server, another hash seed, the weights under another
    path: model_id names them, so every rank reuses its share."""
    first_identity = identity_token(server, processes=2)
    server.flushed_stats()
    stop_server(server)  # two TP=2 servers do not fit this machine at once
    replica = start_server(**_spec("tp2-replica", second_mount, workdir, hash_seed=2))
    try:
        assert f'model="{second_mount}"' not in replica.log(), "model_id should replace the weights path"
        assert identity_token(replica, processes=2) == first_identity
        for name in ("p0", "p1"):
            reload = replica.complete(PROMPTS[name])
            assert replica.counts(reload, "reused") == [FULL_REUSE, FULL_REUSE], name  # one line per rank
            assert_same_output(reload, baseline[name], f"replica's {name} reload")
        stats = replica.fresh_stats()
        assert len(stats) == 2, stats
        for pid, snapshot in stats.items():
            assert snapshot["stores"][STORE]["hits"] == 2 * BLOCKS, (pid, snapshot["stores"][STORE])
    finally:
        stop_server(replica)
