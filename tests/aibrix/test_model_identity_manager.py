"""Two "models" with the same shapes share one EIC (one local:// store)
through AIBrix's real BaseKVCacheManager: with the model identity in every
key, each reads back only its own bytes."""

import logging
import sys
import types

import pytest
import torch
from fake_vllm import fake_vllm_config
from harness import (
    BLOCK_NTOKENS,
    block_layout,
    block_spec,
    make_manager,
    manager_env,
    pattern,
    tokens,
    wait_flushed,
    write_config,
)

from aibrix_eic.config import ENV_CONFIG
from aibrix_eic.connector import EICConnector
from aibrix_eic.engine import get_store

NBLOCKS = 12
SHARED_URL = "local://shared-by-two-models"


def manager_for(monkeypatch, tmp_path, name: str, **config):
    path = write_config(str(tmp_path / f"{name}.yaml"), remote_url=SHARED_URL, **config)
    monkeypatch.setenv(ENV_CONFIG, path)
    return make_manager(block_spec())


def offload(cache, query, seed: int) -> None:
    handle = cache.allocate_for(None, query).get()
    nbytes = cache.block_spec.block_nbytes
    for i, tensor in enumerate(handle.to_tensors()):
        tensor.view(torch.uint8).view(-1).copy_(pattern(seed, i, nbytes))
    status = cache.put(None, query, handle)
    assert status.is_ok(), status
    # Each connector serves its own pending writes; isolation must hold in
    # EIC, so the other model reads only once they are there.
    wait_flushed(cache)


def reload(cache, query) -> tuple[int, list[int | None]]:
    """Tokens reloaded, and for each block the seed whose bytes it holds
    (None: neither model's)."""
    status = cache.acquire(None, query)
    if not status.is_ok():
        return 0, []
    ntokens, handle = status.get()
    nbytes = cache.block_spec.block_nbytes
    try:
        owners = []
        for i, tensor in enumerate(handle.to_tensors()):
            data = tensor.view(torch.uint8).view(-1)
            owners.append(next((seed for seed in (1, 2) if torch.equal(data, pattern(seed, i, nbytes))), None))
    finally:
        handle.release()
    return ntokens, owners


@pytest.fixture(params=["compact", "token-validation"])
def layout(request, monkeypatch):
    with block_layout(compact=request.param == "compact"):
        manager_env(monkeypatch)
        yield request.param


def two_models_share_one_store(monkeypatch, tmp_path, config_a: dict, config_b: dict) -> None:
    model_a = manager_for(monkeypatch, tmp_path, "a", **config_a)
    model_b = manager_for(monkeypatch, tmp_path, "b", **config_b)
    try:
        query = tokens(NBLOCKS, seed=7)  # the same prompt sent to both deployments
        offload(model_a, query, seed=1)
        assert reload(model_b, query) == (0, []), "model B read model A's KV"
        offload(model_b, query, seed=2)
        assert len(get_store(SHARED_URL.removeprefix("local://"))) == 2 * NBLOCKS  # one store, both kept
        assert reload(model_a, query) == (NBLOCKS * BLOCK_NTOKENS, [1] * NBLOCKS)
        assert reload(model_b, query) == (NBLOCKS * BLOCK_NTOKENS, [2] * NBLOCKS)
    finally:
        model_a.close()
        model_b.close()


def test_models_named_by_model_id_read_only_their_own_kv(layout, monkeypatch, tmp_path):
    two_models_share_one_store(monkeypatch, tmp_path, {"model_id": "llama3-8b-ft-a"}, {"model_id": "llama3-8b-ft-b"})


def test_bf16_and_fp8_kv_rollouts_in_vllm_read_only_their_own_kv(layout, monkeypatch, tmp_path):
    """No model_id: the identity comes from the config vLLM publishes."""
    published = {"config": None}
    module = types.ModuleType("vllm.config")
    module.get_current_vllm_config_or_none = lambda: published["config"]
    monkeypatch.setitem(sys.modules, "vllm.config", module)

    model_a = model_b = None
    try:
        published["config"] = fake_vllm_config(cache_dtype="auto")
        model_a = manager_for(monkeypatch, tmp_path, "a")
        published["config"] = fake_vllm_config(cache_dtype="fp8_e4m3")
        model_b = manager_for(monkeypatch, tmp_path, "b")
        published["config"] = None  # vLLM clears it after building the connector
        query = tokens(NBLOCKS, seed=8)
        offload(model_a, query, seed=1)
        assert reload(model_b, query) == (0, [])
        offload(model_b, query, seed=2)
        assert reload(model_a, query) == (NBLOCKS * BLOCK_NTOKENS, [1] * NBLOCKS)
        assert reload(model_b, query) == (NBLOCKS * BLOCK_NTOKENS, [2] * NBLOCKS)
    finally:
        for cache in (model_a, model_b):
            if cache is not None:
                cache.close()


def test_replicas_naming_the_weights_by_model_id_share_kv_across_mount_points(monkeypatch, tmp_path):
    """model_id replaces the weights path: replicas that mount the same
    weights elsewhere read each other's KV; a KV dtype still splits them."""
    manager_env(monkeypatch)
    published = {"config": None}
    module = types.ModuleType("vllm.config")
    module.get_current_vllm_config_or_none = lambda: published["config"]
    monkeypatch.setitem(sys.modules, "vllm.config", module)
    replicas = []
    try:
        for path, cache_dtype in (
            ("/mnt/a/llama3-8b", "auto"),
            ("/models/llama3-8b/", "auto"),
            ("/mnt/a/llama3-8b", "fp8"),
        ):
            published["config"] = fake_vllm_config(model=path, cache_dtype=cache_dtype)
            replicas.append(manager_for(monkeypatch, tmp_path, f"r{len(replicas)}", model_id="llama3-8b@2026-11"))
        published["config"] = None
        query = tokens(NBLOCKS, seed=11)
        offload(replicas[0], query, seed=1)
        assert reload(replicas[1], query) == (NBLOCKS * BLOCK_NTOKENS, [1] * NBLOCKS)
        assert reload(replicas[2], query) == (0, [])
    finally:
        for cache in replicas:
            cache.close()


def test_without_an_identity_the_second_model_reads_the_first_ones_kv(monkeypatch, tmp_path):
    """The failure the identity prevents (and the proof that the tests above
    could fail): same shapes, nothing naming the model, shared keys."""
    manager_env(monkeypatch)
    model_a = manager_for(monkeypatch, tmp_path, "a")
    model_b = manager_for(monkeypatch, tmp_path, "b")
    try:
        query = tokens(NBLOCKS, seed=9)
        offload(model_a, query, seed=1)
        assert reload(model_b, query) == (NBLOCKS * BLOCK_NTOKENS, [1] * NBLOCKS)
    finally:
        model_a.close()
        model_b.close()


def test_changing_the_model_id_turns_old_entries_into_misses(monkeypatch, tmp_path):
    manager_env(monkeypatch)
    before = manager_for(monkeypatch, tmp_path, "before", model_id="prod@rev1")
    query = tokens(NBLOCKS, seed=10)
    try:
        offload(before, query, seed=1)
        assert reload(before, query)[0] == NBLOCKS * BLOCK_NTOKENS
    finally:
        before.close()
    after = manager_for(monkeypatch, tmp_path, "after", model_id="prod@rev2")
    try:
        assert reload(after, query) == (0, [])
        assert after.exists(None, query).is_not_found()
    finally:
        after.close()


def test_open_warns_loudly_only_when_nothing_identifies_the_model(monkeypatch, tmp_path, caplog):
    from aibrix_eic.config import EICConfig

    monkeypatch.delitem(sys.modules, "vllm.config", raising=False)
    with caplog.at_level(logging.INFO, logger="aibrix_eic"):
        anonymous = EICConnector(EICConfig.from_mapping({"remote_url": SHARED_URL, "warmup_keys": 0}), "c")
        assert anonymous.open().is_ok()
        anonymous.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "NO MODEL IDENTITY" in r.getMessage()]
    assert len(warnings) == 1 and "model_id" in warnings[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aibrix_eic"):
        named = EICConnector(EICConfig.from_mapping({"remote_url": SHARED_URL, "warmup_keys": 0, "model_id": "m"}), "c")
        assert named.open().is_ok()
        assert named.health()["model_identity"].startswith(named.model_identity.token)
        named.close()
    assert not [r for r in caplog.records if "NO MODEL IDENTITY" in r.getMessage()]
    assert any("model identity" in r.getMessage() for r in caplog.records)


def test_open_warns_when_the_keys_are_private_to_the_connector(monkeypatch, caplog):
    from aibrix_eic.config import EICConfig

    module = types.ModuleType("vllm.config")
    module.get_current_vllm_config_or_none = lambda: fake_vllm_config(cache_dtype="fp8", calculate_kv_scales=True)
    monkeypatch.setitem(sys.modules, "vllm.config", module)
    with caplog.at_level(logging.INFO, logger="aibrix_eic"):
        conn = EICConnector(EICConfig.from_mapping({"remote_url": SHARED_URL, "warmup_keys": 0, "model_id": "m"}), "c")
        assert conn.open().is_ok()
        conn.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if "PRIVATE to this connector" in w]) == 1, warnings
    assert any("calculate_kv_scales" in w for w in warnings)


def test_check_shows_the_identity_in_use_and_its_namespace_step_uses_the_identified_keys(capsys, tmp_path):
    from aibrix_eic.cli import main
    from aibrix_eic.keys.identity import resolve_identity

    path = write_config(str(tmp_path / "eic.yaml"), remote_url="local://check-identity", model_id="llama3-8b-ft-a")
    code = main(["check", "--config", path])
    out = capsys.readouterr().out
    assert code == 0, out
    token = resolve_identity("llama3-8b-ft-a", vllm_config=None).token
    open_line = next(line for line in out.splitlines() if line.split()[1:2] == ["open"])
    assert f"model identity {token} from model_id" in open_line, open_line
    namespace_line = next(line for line in out.splitlines() if line.split()[1:2] == ["namespace"])
    assert namespace_line.split()[0] == "PASS", out
