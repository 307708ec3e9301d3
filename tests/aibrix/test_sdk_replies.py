"""SDK replies whose top-level status and per-key codes disagree, through
AIBrix's real L2Cache on the embedded engine.

The public clients of the real SDK trust per-key codes only when the
top-level status is SUCCESS or PARTIAL_FAILED; a FAILED reply may still carry
per-key SUCCESS codes (an SGLang fork's test fake returns exactly that). Such
a reply read nothing and stored nothing: counting it as hits reports blocks
whose buffers were never written, and counting it as stored lets the next
get serve the older value.
"""

import pytest
from harness import L2Harness, tokens, use_config

from aibrix_eic.engine import StatusCode, get_store
from aibrix_eic.link.sdk import FAIL, HIT, MISS, REJECTED, SdkClient

STORE = "replies"


@pytest.fixture(params=["direct", "write_behind"])
def l2(request, monkeypatch, tmp_path):
    use_config(
        monkeypatch,
        tmp_path,
        remote_url=f"local://{STORE}",
        put_mode=request.param,
        breaker_failures=1000,  # the breaker would hide the replies behind fast misses
        retry_attempts=1,
        retry_backoff_ms=1,
        retry_backoff_max_ms=2,
    )
    harness = L2Harness()
    yield harness
    get_store(STORE).faults.clear()
    harness.close()


def lying(on: bool) -> None:
    get_store(STORE).faults.default_codes_fail_rate = 1.0 if on else 0.0


def test_a_get_under_failed_with_success_codes_loads_no_block(l2):
    query = tokens(4, seed=1)
    assert l2.put(query, l2.filled_blocks(seed=1, nblocks=4)).get() == 4
    l2.wait_flushed()
    lying(True)
    status, mrs = l2.get(query)
    assert not status.is_ok(), f"reported {status.get()} blocks loaded; no buffer was written"
    assert not any(l2.matches(mr, seed=1, block_index=i) for i, mr in enumerate(mrs))


def test_exists_under_failed_with_success_codes_finds_nothing(l2):
    query = tokens(4, seed=2)
    assert l2.put(query, l2.filled_blocks(seed=2, nblocks=4)).get() == 4
    l2.wait_flushed()
    lying(True)
    status = l2.exists(query)
    assert not status.is_ok(), f"exists reported {status.get()} blocks under a FAILED reply"


def test_a_put_under_failed_with_success_codes_never_leaves_the_older_value_served(l2):
    query = tokens(4, seed=3)
    assert l2.put(query, l2.filled_blocks(seed=3, nblocks=4)).get() == 4  # v1
    l2.wait_flushed()
    lying(True)
    v2 = l2.put(query, l2.filled_blocks(seed=4, nblocks=4))
    l2.wait_flushed()
    lying(False)
    status, mrs = l2.get(query)
    loaded = status.get() if status.is_ok() else 0
    if v2.is_ok():  # accepted (write-behind): a later get returns v2 or nothing
        assert loaded == 0 or all(l2.matches(mrs[i], seed=4, block_index=i) for i in range(loaded))
        assert not any(l2.matches(mrs[i], seed=3, block_index=i) for i in range(loaded)), "served v1 after v2's put"
    else:  # the put said it failed: v1 or v2 may be served, never a mix within a block
        for i in range(loaded):
            assert l2.matches(mrs[i], seed=3, block_index=i) or l2.matches(mrs[i], seed=4, block_index=i)
    if l2.connector._config.put_mode == "direct":
        assert not v2.is_ok(), "a put whose mset FAILED counted as stored"


class ScriptedClient:
    """Answers every call with one fixed (status, codes) reply."""

    def __init__(self, status, codes):
        self.reply = status, type("Outcome", (), {"status_codes": codes})()

    def mset(self, keys, vals, option):
        return self.reply

    def mget(self, keys, option, vals):
        return self.reply[0], vals, self.reply[1]

    def mexist(self, keys, option):
        return self.reply

    def mdel(self, keys, option):
        return self.reply


def sdk_client(status, codes) -> SdkClient:
    import aibrix_eic.engine as engine
    from aibrix_eic.config import EICConfig

    return SdkClient(engine, ScriptedClient(status, codes), EICConfig())


S, F, P, K = StatusCode.SUCCESS, StatusCode.FAILED, StatusCode.PARTIAL_FAILED, StatusCode.KEY_NOT_EXIST


@pytest.mark.parametrize(
    "status, codes, outcomes, whole_call_failed",
    [
        (S, [S, K, F], [HIT, MISS, FAIL], False),  # SUCCESS: the codes decide
        (P, [S, K, F], [HIT, MISS, FAIL], False),  # PARTIAL_FAILED naming its failures: the codes decide
        (F, [S, S, S], [FAIL, FAIL, FAIL], True),  # FAILED: nothing read or stored, whatever the codes
        (StatusCode.TIMEOUT, [S, S], [FAIL, FAIL], True),  # any other status too
        (F, [K, K], [MISS, MISS], False),  # FAILED all-miss (mget of absent keys): misses
        (F, [S, K], [FAIL, MISS], False),
        (P, [S, S], [FAIL, FAIL], True),  # PARTIAL_FAILED that names no failure: nothing confirmed
        (F, [StatusCode.VALUE_TOO_LARGE], [REJECTED], False),
    ],
)
def test_success_codes_count_only_under_a_status_that_allows_them(status, codes, outcomes, whole_call_failed):
    for call in ("mset", "mget", "mdel"):
        client = sdk_client(status, codes)
        args = ([f"k{i}" for i in range(len(codes))],)
        if call != "mdel":
            args += ([(4096 * (i + 1), 64, False) for i in range(len(codes))],)
        result = getattr(client, call)(*args)
        assert (result.outcomes, result.whole_call_failed) == (outcomes, whole_call_failed), call
