"""EICConnector under AIBrix's BaseKVCacheManager: the object vLLM's AIBrix
connectors build in each TP rank."""

import pytest
from harness import (
    BLOCK_NTOKENS,
    block_layout,
    block_spec,
    connector_of,
    make_manager,
    manager_env,
    receive,
    send,
    tokens,
    use_config,
    wait_flushed,
)

from aibrix_eic.connector import EICConnector
from aibrix_eic.engine import get_store


@pytest.fixture(params=["compact", "token-validation"])
def manager(request, monkeypatch, tmp_path):
    with block_layout(compact=request.param == "compact"):
        manager_env(monkeypatch)
        use_config(monkeypatch, tmp_path, remote_url="local://mgr", batch_keys=8)
        cache = make_manager(block_spec())
        try:
            yield cache
        finally:
            cache.close()


def offload(cache, query, seed: int) -> int:
    status = send(cache, query, seed)
    assert status.is_ok(), status
    return status.get()


def reload(cache, query, seed: int) -> tuple[int, bool]:
    return receive(cache, query, seed)


def test_manager_builds_our_connector_and_registers_its_slabs(manager):
    conn = connector_of(manager)
    assert isinstance(conn, EICConnector)
    assert conn.health()["registered_regions"] == len(manager._allocator.slabs) > 0


def test_offload_and_reload_bit_exact(manager):
    query = tokens(40, seed=1)
    assert offload(manager, query, seed=1) == 40 * BLOCK_NTOKENS
    assert manager.exists(None, query).get() == 40 * BLOCK_NTOKENS
    ntokens, exact = reload(manager, query, seed=1)
    assert ntokens == 40 * BLOCK_NTOKENS and exact


def test_deleted_block_in_the_middle_reloads_only_the_prefix(manager):
    query = tokens(40, seed=2)
    offload(manager, query, seed=2)
    conn = connector_of(manager)
    key = list(manager._l2_cache._cache_block_keys(None, query))[23][1]
    future = __import__("asyncio").run_coroutine_threadsafe(conn.delete(key), manager._event_loop)
    assert future.result(timeout=10).is_ok()
    ntokens, exact = reload(manager, query, seed=2)
    assert ntokens == 23 * BLOCK_NTOKENS
    assert exact


@pytest.mark.usefixtures("mexist_miss")
def test_missing_first_block_reloads_nothing(manager):
    query = tokens(10, seed=3)
    offload(manager, query, seed=3)
    wait_flushed(manager)  # else the clear misses writes still pending
    get_store("mgr").clear()
    ntokens, _ = reload(manager, query, seed=3)
    assert ntokens == 0
    assert manager.exists(None, query).is_not_found()


def spy_registered_flags(monkeypatch) -> tuple[list[bool], list[bool]]:
    """The `registered` flags of every engine mset and mget buffer."""
    import aibrix_eic.engine as engine

    put_flags: list[bool] = []
    get_flags: list[bool] = []
    original_mset, original_mget = engine.Client.mset, engine.Client.mget

    def spy_mset(self, keys, vals, option):
        put_flags.extend(registered for _, _, registered in vals)
        return original_mset(self, keys, vals, option)

    def spy_mget(self, keys, option, vals):
        get_flags.extend(registered for _, _, registered in vals)
        return original_mget(self, keys, option, vals)

    monkeypatch.setattr(engine.Client, "mset", spy_mset)
    monkeypatch.setattr(engine.Client, "mget", spy_mget)
    return put_flags, get_flags


def test_registered_buffers_are_read_registered_and_written_unregistered(manager, monkeypatch):
    put_flags, get_flags = spy_registered_flags(monkeypatch)
    query = tokens(4, seed=4)
    offload(manager, query, seed=4)
    wait_flushed(manager)  # the reload must come from EIC, not from the pending writes
    assert reload(manager, query, seed=4) == (4 * BLOCK_NTOKENS, True)
    assert put_flags == [False] * 4  # put_registered defaults to false, as upstream wrote
    assert get_flags == [True] * 4


def test_put_registered_passes_registered_put_buffers_as_registered(monkeypatch, tmp_path):
    manager_env(monkeypatch)
    use_config(monkeypatch, tmp_path, remote_url="local://mgr", put_registered=True)
    cache = make_manager(block_spec())
    try:
        put_flags, _ = spy_registered_flags(monkeypatch)
        query = tokens(4, seed=5)
        offload(cache, query, seed=5)
        wait_flushed(cache)
        assert reload(cache, query, seed=5) == (4 * BLOCK_NTOKENS, True)
        assert put_flags == [True] * 4
    finally:
        cache.close()
