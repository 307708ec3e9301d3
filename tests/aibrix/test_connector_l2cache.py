"""EICConnector driven through AIBrix's real L2Cache, on the embedded engine."""

import pytest
from harness import BLOCK_NTOKENS, L2Harness, block_layout, block_spec, tokens, use_config

import aibrix_eic.engine as engine
from aibrix_eic.connector import EICConnector
from aibrix_eic.engine import get_store


@pytest.fixture(params=["compact", "token-validation"])
def layout(request):
    with block_layout(compact=request.param == "compact"):
        yield request.param


@pytest.fixture
def make_l2(monkeypatch, tmp_path, layout):
    harnesses = []

    def build(op_batch: int = 8, **config) -> L2Harness:
        config.setdefault("remote_url", "local://l2")
        use_config(monkeypatch, tmp_path, **config)
        harness = L2Harness(op_batch=op_batch)
        harnesses.append(harness)
        assert isinstance(harness.connector, EICConnector)
        return harness

    yield build
    for harness in harnesses:
        harness.close()


@pytest.fixture
def sdk_calls(monkeypatch):
    """Counts of SDK calls by name, and the keys each call carried."""
    calls: dict[str, list[int]] = {"mset": [], "mget": [], "mexist": [], "mdel": []}
    for name in calls:
        original = getattr(engine.Client, name)

        def spy(self, keys, *args, _original=original, _name=name):
            calls[_name].append(len(keys))
            return _original(self, keys, *args)

        monkeypatch.setattr(engine.Client, name, spy)
    return calls


def test_put_then_get_returns_exact_bytes(make_l2):
    l2 = make_l2()
    query = tokens(12, seed=1)
    assert l2.put(query, l2.filled_blocks(seed=1, nblocks=12)).get() == 12
    status, mrs = l2.get(query)
    assert status.get() == 12
    assert all(l2.matches(mr, seed=1, block_index=i) for i, mr in enumerate(mrs))


@pytest.mark.usefixtures("mexist_miss")
def test_exists_counts_stored_blocks(make_l2):
    l2 = make_l2()
    query = tokens(10, seed=2)
    assert l2.exists(query).is_not_found()
    l2.put(query, l2.filled_blocks(seed=2, nblocks=10))
    assert l2.exists(query).get() == 10


def test_get_of_unknown_blocks_is_not_found_not_error(make_l2):
    l2 = make_l2()
    status, _ = l2.get(tokens(3, seed=3))
    assert status.is_not_found()


def test_delete_really_deletes(make_l2):
    l2 = make_l2()
    query = tokens(4, seed=4)
    l2.put(query, l2.filled_blocks(seed=4, nblocks=4))
    l2.wait_flushed()
    assert len(get_store("l2")) == 4
    assert l2.delete_block(query, 0).is_ok()
    assert len(get_store("l2")) == 3
    assert l2.delete_block(query, 0).is_not_found()
    status, _ = l2.get(query)
    assert status.is_not_found()


def test_mput_and_mget_span_several_sdk_calls(make_l2, sdk_calls):
    # direct: asserts the shape of the put's own SDK calls; write-behind's counterpart is in test_write_behind.py
    l2 = make_l2(batch_keys=4, op_batch=8, put_mode="direct")
    query = tokens(30, seed=5)
    assert l2.put(query, l2.filled_blocks(seed=5, nblocks=30)).get() == 30
    status, mrs = l2.get(query)
    assert status.get() == 30
    assert all(l2.matches(mr, seed=5, block_index=i) for i, mr in enumerate(mrs))
    # One request, split into SDK calls of at most batch_keys keys.
    assert sdk_calls["mset"] == [4] * 7 + [2]
    assert sdk_calls["mget"] == [4] * 7 + [2]


@pytest.mark.usefixtures("mexist_miss")
def test_exists_of_one_l2cache_batch_is_one_mexist(make_l2, sdk_calls):
    l2 = make_l2(op_batch=8, warmup_keys=0)
    query = tokens(24, seed=6)
    l2.put(query, l2.filled_blocks(seed=6, nblocks=24))
    l2.wait_flushed()  # else exists is answered from the pending writes
    assert l2.exists(query).get() == 24
    # L2Cache asks one key at a time, 8 at once; each tick's keys share a call.
    assert sdk_calls["mexist"] == [8, 8, 8]


@pytest.mark.parametrize("hole", [0, 5, 13, 29])
def test_hole_in_the_middle_returns_only_the_prefix(make_l2, hole):
    l2 = make_l2(batch_keys=4, op_batch=8)
    query = tokens(30, seed=7)
    l2.put(query, l2.filled_blocks(seed=7, nblocks=30))
    assert l2.delete_block(query, hole).is_ok()
    status, mrs = l2.get(query)
    if hole == 0:
        assert status.is_not_found()
        return
    assert status.get() == hole
    assert all(l2.matches(mrs[i], seed=7, block_index=i) for i in range(hole))
    assert l2.exists(query).get() == hole


def test_mget_statuses_are_prefix_closed(make_l2):
    l2 = make_l2(batch_keys=4)
    query = tokens(12, seed=8)
    l2.put(query, l2.filled_blocks(seed=8, nblocks=12))
    l2.delete_block(query, 5)
    keys = [key for _, key in l2.cache._cache_block_keys(None, query)]
    statuses = l2.run(l2.connector.mget(keys, l2.blocks(12)))
    assert [s.is_ok() for s in statuses] == [True] * 5 + [False] * 7
    assert statuses[5].is_not_found()


@pytest.mark.usefixtures("mexist_miss")
def test_namespace_applies_to_set_get_exists_and_delete(make_l2, monkeypatch, tmp_path):
    tenant_a = make_l2(eic_kv_ns="tenant-a")
    query = tokens(6, seed=9)
    tenant_a.put(query, tenant_a.filled_blocks(seed=9, nblocks=6))
    tenant_a.wait_flushed()
    assert {ns for ns, _ in get_store("l2").keys()} == {"tenant-a"}
    assert tenant_a.exists(query).get() == 6
    assert tenant_a.get(query)[0].get() == 6
    tenant_b = make_l2(eic_kv_ns="tenant-b")
    assert tenant_b.exists(query).is_not_found()
    assert tenant_b.get(query)[0].is_not_found()
    assert tenant_b.delete_block(query, 0).is_not_found()
    assert tenant_a.delete_block(query, 0).is_ok()
    assert len(get_store("l2")) == 5


def test_ttl_is_applied_on_set(make_l2):
    now = [1000.0]
    get_store("l2").clock = lambda: now[0]
    l2 = make_l2(eic_kv_ttl=30)
    query = tokens(3, seed=10)
    l2.put(query, l2.filled_blocks(seed=10, nblocks=3))
    l2.wait_flushed()
    now[0] += 29
    assert l2.exists(query).get() == 3
    now[0] += 2
    assert l2.exists(query).is_not_found()
    assert l2.get(query)[0].is_not_found()


def test_overwrite_replaces_the_value(make_l2):
    l2 = make_l2()
    query = tokens(2, seed=11)
    l2.put(query, l2.filled_blocks(seed=11, nblocks=2))
    l2.put(query, l2.filled_blocks(seed=12, nblocks=2))
    status, mrs = l2.get(query)
    assert status.get() == 2
    assert l2.matches(mrs[0], seed=12, block_index=0)


def test_tp_ranks_do_not_see_each_other(monkeypatch, tmp_path, layout):
    use_config(monkeypatch, tmp_path, remote_url="local://l2")
    # Same shape, different heads: AIBrix gives each TP rank its own conn_id.
    rank0 = L2Harness(spec=block_spec(heads=2, first_head=0))
    rank1 = L2Harness(spec=block_spec(heads=2, first_head=2))
    try:
        assert rank0.connector.conn_id != rank1.connector.conn_id
        query = tokens(4, seed=13)
        rank0.put(query, rank0.filled_blocks(seed=13, nblocks=4))
        rank0.wait_flushed()  # isolation through EIC, not just separate pending tables
        assert rank1.exists(query).is_not_found()
        assert rank0.exists(query).get() == 4
    finally:
        rank0.close()
        rank1.close()


def test_blocks_whose_size_differs_are_invalid(make_l2, layout):
    if layout != "compact":
        pytest.skip("token-validation blocks vary in size by design")
    l2 = make_l2(block_nbytes=4096)
    query = tokens(1, seed=14)
    status = l2.put(query, l2.filled_blocks(seed=14, nblocks=1))
    assert status.is_invalid()
    assert "blocks are 4096 bytes" in str(status.value)


@pytest.mark.usefixtures("mexist_miss")
def test_warm_up_is_one_bounded_round_trip(monkeypatch, tmp_path, sdk_calls):
    use_config(monkeypatch, tmp_path, remote_url="local://l2", warmup_keys=256)
    harness = L2Harness()
    try:
        assert sdk_calls["mexist"] == [256]
    finally:
        harness.close()


def test_block_count_beyond_one_request_uses_each_block_once(make_l2, sdk_calls):
    l2 = make_l2(batch_keys=64)
    query = tokens(40, seed=15)
    l2.put(query, l2.filled_blocks(seed=15, nblocks=40))
    l2.wait_flushed()
    assert sum(sdk_calls["mset"]) == 40
    status, _ = l2.get(query)
    assert status.get() == 40 and sum(sdk_calls["mget"]) == 40


def test_prefix_get_reads_the_suffix(make_l2):
    l2 = make_l2()
    query = tokens(8, seed=16)
    l2.put(query, l2.filled_blocks(seed=16, nblocks=8))
    prefix, suffix = query[: 4 * BLOCK_NTOKENS], query[4 * BLOCK_NTOKENS :]
    status, mrs = l2.get(suffix, prefix=prefix, prefix_blocks=4)
    assert status.get() == 4
    assert all(l2.matches(mrs[i], seed=16, block_index=4 + i) for i in range(4))


def test_a_block_of_another_sequence_ends_the_prefix_in_the_token_layout(make_l2, layout):
    """A second writer (or a hash collision) stores, under one of our keys, a
    well-formed block of another sequence: it must not count as loaded, nor
    may any block after it (L2Cache skips it but counts the rest)."""
    if layout == "compact":
        pytest.skip("the compact layout stores no tokens to check")
    l2 = make_l2()
    ours, theirs = tokens(4, seed=17), tokens(4, seed=18)
    l2.put(ours, l2.filled_blocks(seed=17, nblocks=4))
    their_blocks = l2.blocks(4)
    l2.put(theirs, their_blocks)  # packs their tokens into their blocks
    our_keys = [key for _, key in l2.cache._cache_block_keys(None, ours)]
    assert isinstance(l2.run(l2.connector.mput([our_keys[1]], [their_blocks[1]])), list)
    status, mrs = l2.get(ours)
    assert status.get() == 1
    assert l2.matches(mrs[0], seed=17, block_index=0)
