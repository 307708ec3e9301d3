"""The Status rules of request/statuses.py on their own, over arbitrary
outcome lists: what AIBrix is told per key, the prefix closure, what an mput
returns; and which failed keys a call retries (link/calls.py's rules)."""

from dataclasses import dataclass

from aibrix_kvcache.status import Status, StatusCodes
from hypothesis import given
from hypothesis import strategies as st

from aibrix_eic.link.calls import failed, failed_before_first_miss
from aibrix_eic.link.sdk import FAIL, HIT, MISS, REJECTED
from aibrix_eic.request.statuses import (
    FAST_MISS,
    OK,
    close_after,
    key_statuses,
    put_outcome,
    unloaded_reasons,
)

OUTCOME = st.sampled_from([HIT, MISS, FAIL, REJECTED])


@dataclass
class Answered:
    keys: list[str]
    outcomes: list | None
    detail: str = "boom"


# A request's chunks: each answered with per-key outcomes, or None (deadline).
CHUNKS = st.lists(st.one_of(st.lists(OUTCOME, min_size=1, max_size=6), st.integers(1, 6)), min_size=1, max_size=5).map(
    lambda parts: [
        Answered([f"k{i}" for i in range(p if isinstance(p, int) else len(p))], None if isinstance(p, int) else p)
        for p in parts
    ]
)


def expected_code(outcome) -> StatusCodes:
    return {HIT: StatusCodes.OK, MISS: StatusCodes.NOT_FOUND}.get(outcome, StatusCodes.ERROR)


@given(CHUNKS)
def test_key_statuses_one_per_key_and_the_first_bad_index(chunks):
    statuses, first_bad = key_statuses(chunks, "get", 150)
    flat = [(o, c) for c in chunks for o in (c.outcomes or [None] * len(c.keys))]
    assert len(statuses) == len(flat)
    for status, (outcome, _chunk) in zip(statuses, flat):
        if outcome is None:
            assert status.error_code is StatusCodes.TIMEOUT and "get_timeout_ms=150" in status.value
        else:
            assert status.error_code is expected_code(outcome)
            if status.error_code is StatusCodes.ERROR:
                assert "boom" in status.value  # the SDK's detail reaches the caller
    bad = [i for i, s in enumerate(statuses) if not s.is_ok()]
    assert first_bad == (bad[0] if bad else len(statuses))


@given(CHUNKS)
def test_close_after_keeps_the_prefix_and_no_ok_after_a_hole(chunks):
    statuses, first_bad = key_statuses(chunks, "get", 150)
    before = list(statuses)
    close_after(statuses, first_bad)
    assert statuses[: first_bad + 1] == before[: first_bad + 1]  # the prefix and the hole itself unchanged
    assert not any(s.is_ok() for s in statuses[first_bad + 1 :])
    assert all(s.is_not_found() and f"block {first_bad}" in s.value for s in statuses[first_bad + 1 :])
    assert sum(1 for s in statuses if s.is_ok()) == first_bad  # AIBrix reads the OK count as the loaded prefix


@given(CHUNKS)
def test_close_after_is_idempotent(chunks):
    statuses, first_bad = key_statuses(chunks, "get", 150)
    close_after(statuses, first_bad)
    once = list(statuses)
    close_after(statuses, first_bad)
    assert statuses == once


@given(CHUNKS)
def test_put_outcome_is_a_list_only_when_every_block_was_stored(chunks):
    statuses, first_bad = key_statuses(chunks, "put", 200)
    result, stored = put_outcome(statuses, first_bad)
    assert stored == sum(1 for s in statuses if s.is_ok())
    if all(s.is_ok() for s in statuses):
        assert result == statuses and stored == len(statuses)
    else:
        # L2Cache 0.8 crashes on a list with a failure in it: one Status instead.
        assert isinstance(result, Status) and not result.is_ok()
        assert result.error_code is statuses[first_bad].error_code
        assert f"{len(statuses) - stored} of {len(statuses)} blocks not stored" in result.value


@given(st.lists(OUTCOME, max_size=12))
def test_a_get_retries_only_failed_keys_before_the_first_miss(outcomes):
    again = failed_before_first_miss(outcomes)
    end = outcomes.index(MISS) if MISS in outcomes else len(outcomes)
    assert again == [i for i in range(end) if outcomes[i] == FAIL]
    assert all(i < end for i in again)  # a key after a miss can never be reported loaded


@given(st.lists(OUTCOME, max_size=12))
def test_puts_and_deletes_retry_every_key_that_failed_in_transit(outcomes):
    assert failed(outcomes) == [i for i, o in enumerate(outcomes) if o == FAIL]
    assert all(outcomes[i] != REJECTED for i in failed(outcomes))  # a rejection is final


@given(CHUNKS)
def test_unloaded_reasons_split_errors_and_timeouts(chunks):
    reasons = unloaded_reasons(chunks)
    assert reasons["get_timeouts"] == sum(len(c.keys) for c in chunks if c.outcomes is None)
    assert reasons["get_errors"] == sum(
        1 for c in chunks if c.outcomes is not None for o in c.outcomes if o not in (HIT, MISS)
    )


def test_the_fast_failures_are_distinct_objects_from_plain_answers():
    assert FAST_MISS is not OK and FAST_MISS.is_not_found()
    assert FAST_MISS is not Status(StatusCodes.NOT_FOUND)
