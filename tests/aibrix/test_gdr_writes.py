"""Registered (GDR) writes that EIC refuses per key with GDR_TRANSFER_ERROR
are re-sent unregistered, in every put mode, so the block is still stored.
The engine's `gdr_write_fail_rate` produces that reply."""

import uuid

import pytest
from harness import (
    BLOCK_NTOKENS,
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

import aibrix_eic.engine as engine
from aibrix_eic.engine import get_store
from aibrix_eic.observability.metrics import families

NBLOCKS = 6


@pytest.fixture
def mset_flags(monkeypatch) -> list[list[bool]]:
    """The `registered` flags of each engine mset, in call order."""
    calls: list[list[bool]] = []
    original = engine.Client.mset

    def spy(self, keys, vals, option):
        calls.append([registered for _, _, registered in vals])
        return original(self, keys, vals, option)

    monkeypatch.setattr(engine.Client, "mset", spy)
    return calls


def manager_on(monkeypatch, tmp_path, put_mode: str, gdr_write_fail_rate: float, **config):
    manager_env(monkeypatch)
    # breaker_failures=1: a refusal must not count as EIC being down, or the re-send would not go out.
    settings = dict(put_mode=put_mode, put_registered=True, batch_keys=8, retry_attempts=0, breaker_failures=1,
                    eic_kv_ns=f"gdr-{uuid.uuid4().hex[:8]}")  # fmt: skip
    settings.update(config)
    use_config(monkeypatch, tmp_path, remote_url=f"local://gdr?gdr_write_fail_rate={gdr_write_fail_rate}&seed=3",
               **settings)  # fmt: skip
    return make_manager(block_spec())


def gdr_resends_series(cache) -> float:
    """aibrix_eic_gdr_resends_total of this cache's connector (its namespace is unique)."""
    namespace = connector_of(cache).health()["namespace"]
    return sum(
        sample.value
        for metric in families().gdr_resends.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["eic_namespace"] == namespace
    )


@pytest.mark.parametrize("put_mode", ["direct", "write_behind"])
def test_blocks_refused_as_registered_writes_are_stored_unregistered(monkeypatch, tmp_path, mset_flags, put_mode):
    cache = manager_on(monkeypatch, tmp_path, put_mode, 1.0)
    try:
        query = tokens(NBLOCKS, seed=1)
        assert send(cache, query, seed=1).is_ok()
        wait_flushed(cache)  # the reload must come from EIC, not from pending writes
        assert len(get_store("gdr")) == NBLOCKS
        assert receive(cache, query, seed=1) == (NBLOCKS * BLOCK_NTOKENS, True)
        # One registered mset (refused), then the same keys unregistered; no retry budget used.
        assert mset_flags == [[True] * NBLOCKS, [False] * NBLOCKS]
        health = connector_of(cache).health()
        assert health["gdr_resends"] == gdr_resends_series(cache) == NBLOCKS
        assert health["retries"] == 0 and health["put_failures"] == 0
        assert health["breaker"] == "closed" and health["consecutive_failures"] == 0
    finally:
        cache.close()


def test_only_the_refused_keys_are_re_sent(monkeypatch, tmp_path, mset_flags):
    cache = manager_on(monkeypatch, tmp_path, "direct", 0.5)
    try:
        query = tokens(NBLOCKS * 4, seed=2)
        assert send(cache, query, seed=2).is_ok()
        assert receive(cache, query, seed=2) == (NBLOCKS * 4 * BLOCK_NTOKENS, True)
        first_calls = [flags for flags in mset_flags if all(flags)]
        resends = [flags for flags in mset_flags if not any(flags)]
        assert len(first_calls) + len(resends) == len(mset_flags)
        refused = sum(len(flags) for flags in resends)
        assert 0 < refused < NBLOCKS * 4
        assert connector_of(cache).health()["gdr_resends"] == refused
    finally:
        cache.close()


def test_retries_of_refused_keys_stay_unregistered(monkeypatch, tmp_path, mset_flags):
    """The unregistered re-send fails in transit; the ordinary retry that
    follows must not go back to the registered path."""
    cache = manager_on(monkeypatch, tmp_path, "direct", 1.0, retry_attempts=1, breaker_failures=5)
    spied = engine.Client.mset  # the mset_flags spy

    def resend_fails_in_transit(self, keys, vals, option):
        reply = spied(self, keys, vals, option)
        if len(mset_flags) == 2:  # the re-send: nothing stored, every key FAILED
            self._store.delete_many(option.ns, list(keys))
            return engine.StatusCode.FAILED, engine.Outcome([engine.StatusCode.FAILED] * len(keys))
        return reply

    monkeypatch.setattr(engine.Client, "mset", resend_fails_in_transit)
    try:
        query = tokens(NBLOCKS, seed=3)
        assert send(cache, query, seed=3).is_ok()
        assert receive(cache, query, seed=3) == (NBLOCKS * BLOCK_NTOKENS, True)
        assert mset_flags == [[True] * NBLOCKS, [False] * NBLOCKS, [False] * NBLOCKS]
        health = connector_of(cache).health()
        assert (health["gdr_resends"], health["retries"]) == (NBLOCKS, NBLOCKS)
    finally:
        cache.close()
