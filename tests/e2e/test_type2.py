"""AIBrix's Type2 offloading connector (layer-wise: each layer's KV staged in
`save_kv_layer` as it is computed, each layer's reload started in
`wait_for_layer_load` of the layer before) with our L2, through the
cpu_type2 adapter; AIBrix L1 off, prefix caching off.

Two replicas on one shared engine store (`local://type2?dir=...`): the
Type2 server and a Type1 peer. Both connectors build the same cache manager
with the same block layout, so their keys and stored bytes are the same and
each reuses what the other computed.
"""

import pytest
from conftest import (
    FULL_REUSE,
    PROMPTS,
    assert_fork_reuses_shared_blocks,
    assert_poisoned_reload_differs,
    assert_replicas_reuse_each_other,
    assert_same_output,
    claim_server,
    first_send,
    identity_token,
    open_line,
    queue_server,
    shared_store_url,
    stop_server,
    store_stats,
    write_config,
)
from server import ENGINE_BLOCK, TYPE1_CPU, TYPE2_CPU, Server

STORE = "type2"
BLOCKS = FULL_REUSE // ENGINE_BLOCK


def _spec(name: str, kv_transfer: dict, hash_seed: int):
    def spec(model_dir, workdir) -> dict:
        config = write_config(workdir, name, f"remote_url: {shared_store_url(workdir, STORE)}\n")
        env = {"AIBRIX_KV_CACHE_OL_EIC_CONFIG": str(config), "PYTHONHASHSEED": str(hash_seed)}
        return dict(name=name, model_dir=model_dir, workdir=workdir, kv_transfer=kv_transfer, env=env)

    return spec


queue_server(__file__, "type2", _spec("type2", TYPE2_CPU, hash_seed=21))
queue_server(__file__, "type2-peer", _spec("type2-peer", TYPE1_CPU, hash_seed=22))


@pytest.fixture(scope="module")
def server(model_dir, workdir, baseline):
    server = claim_server("type2", model_dir, workdir)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def peer(server, model_dir, workdir):
    peer = claim_server("type2-peer", model_dir, workdir)
    yield peer
    stop_server(peer)


def _store(server: Server) -> dict:
    return store_stats(server, STORE)


def test_the_type2_connector_opens_our_l2(server, workdir):
    server.wait_log(open_line(shared_store_url(workdir, STORE)))
    assert '"kv_connector_module_path": "cpu_type2"' in " ".join(server.argv)
    server.wait_log(r"AIBrixOffloadingConnector is initialized")


def test_layerwise_offload_then_layerwise_reloads(server, baseline):
    prompt = PROMPTS["p0"]
    first_send(server, "p0", baseline)
    server.flushed_stats()
    store = _store(server)
    assert store["keys"] == BLOCKS, store
    hits_before = store["hits"]
    for attempt in range(2):
        again = server.complete(prompt)
        assert server.reuse(again) == FULL_REUSE, f"reload {attempt}"
        assert_same_output(again, baseline["p0"], f"reload {attempt}")
    assert _store(server)["hits"] - hits_before == 2 * BLOCKS


def test_a_shared_prefix_reuses_only_the_shared_blocks(server, baseline):
    assert_fork_reuses_shared_blocks(server, baseline)


def test_replicas_reuse_each_others_kv_across_connectors(server, peer, baseline):
    assert identity_token(server) == identity_token(peer)
    # what the Type2 server stored, the Type1 peer reloads, and what the
    # peer computed, the Type2 server reloads layer by layer
    assert_replicas_reuse_each_other(server, peer, baseline, STORE)


def test_reloaded_kv_really_comes_from_our_store(server, baseline):
    """Last: overwrite every stored block; the next layer-wise reload must
    give other outputs, so the equal outputs above were computed from the
    KV Type2 loaded from our L2 into every layer, not recomputed."""
    assert_poisoned_reload_differs(server, baseline, STORE)
