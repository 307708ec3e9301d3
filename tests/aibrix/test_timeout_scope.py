"""The timeout-ordering workaround (aibrix_compat.order_timeouts) applies to
the cache managers whose L2 backend is this connector, and to no other: a
manager on AIBrix's own MOCK backend in the same process times out exactly as
stock AIBrix does, even once an EIC manager exists.

Each test holds a manager's event-loop thread inside its reload past
AIBrix's timeout (harness.stall_next_get); what tells the two behaviours
apart is whether acquire() returned before the stalled reload ended, an
order of events, not a duration."""

import threading
from concurrent.futures import Future

import pytest
from harness import (
    BLOCK_NTOKENS,
    block_spec,
    connector_of,
    make_manager,
    manager_env,
    send,
    stall_next_get,
    tokens,
    use_config,
)

from aibrix_eic.aibrix_compat import timeouts as aibrix_compat

NBLOCKS = 2
MAX_STALL_S = 10.0  # only reached if a manager waits for the stalled reload


@pytest.fixture
def managers(monkeypatch, tmp_path):
    """(EIC manager, MOCK manager), the EIC one built first; the timeout of
    either is NBLOCKS * 16 tokens * 1 ms."""
    # Stock AIBrix gives up at its timeout; the ordering waits for a started
    # reload. Long here, so that a MOCK manager wrongly ordered waits for
    # the stall to end rather than give up on its own.
    monkeypatch.setattr(aibrix_compat, "DRAIN_TIMEOUT_S", 2 * MAX_STALL_S)
    manager_env(monkeypatch, AIBRIX_KV_CACHE_OL_L2_CACHE_PER_TOKEN_TIMEOUT_MS="1")
    use_config(monkeypatch, tmp_path, remote_url="local://scope")
    built = []
    try:
        built.append(make_manager(block_spec(), max_tokens=NBLOCKS * BLOCK_NTOKENS))
        monkeypatch.setenv("AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND", "MOCK")
        built.append(make_manager(block_spec(), max_tokens=NBLOCKS * BLOCK_NTOKENS))
        eic, mock = built
        assert connector_of(eic).name == "aibrix_eic" and connector_of(mock).name != "aibrix_eic"
        yield eic, mock
    finally:
        for cache in built:
            cache.close()


def stalled_acquire(monkeypatch, cache, seed: int, let_go: threading.Event) -> tuple[bool, bool]:
    """acquire() while the reload is stalled: (timed out, whether acquire
    returned while the stalled reload was still running)."""
    query = tokens(NBLOCKS, seed=seed)
    assert send(cache, query, seed).is_ok()
    _, ended = stall_next_get(monkeypatch, cache, let_go, MAX_STALL_S)
    status = cache.acquire(None, query)
    returned_first = not ended.is_set()
    let_go.set()
    assert ended.wait(MAX_STALL_S + 5)
    if status.is_ok():
        status.get()[1].release()
    return status.is_timeout(), returned_first


def test_a_mock_manager_times_out_as_stock_aibrix_next_to_an_eic_manager(managers, monkeypatch):
    _, mock = managers
    timed_out, returned_first = stalled_acquire(monkeypatch, mock, seed=1, let_go=threading.Event())
    assert timed_out
    assert returned_first, "the MOCK manager waited for its stalled reload: the EIC ordering reached it"


def test_the_eic_manager_still_waits_for_its_started_reload(managers, monkeypatch):
    eic, _ = managers
    let_go = threading.Event()
    threading.Timer(0.3, let_go.set).start()  # the stall ends by itself; the manager must wait for it
    timed_out, returned_first = stalled_acquire(monkeypatch, eic, seed=2, let_go=let_go)
    assert timed_out
    assert not returned_first, "the EIC manager released its regions while its reload still ran"


def test_only_requests_to_our_connector_get_ordered_futures(managers):
    """The same decision on the coroutines AIBrix's cache manager really
    passes (L2Cache's own methods, not a test stand-in)."""
    from aibrix_kvcache import cache_manager

    query = tokens(NBLOCKS, seed=3)
    for cache, ordered in zip(managers, (True, False)):
        future = cache_manager.asyncio.run_coroutine_threadsafe(cache._l2_cache.exists(None, query), cache._event_loop)
        assert isinstance(future, aibrix_compat._OrderedTimeoutFuture) is ordered
        assert isinstance(future, Future) is not ordered  # asyncio's own, untouched
        future.result(MAX_STALL_S)
