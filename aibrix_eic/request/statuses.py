"""The rules that decide what AIBrix sees: per-key SDK outcomes become
Statuses, mget results are prefix-closed, a put that stored less than every
block becomes one error Status, and what a request gets while EIC is down.
Pure functions, no state, so each rule can be tested without an engine.
"""

from collections.abc import Sequence
from typing import Any, Protocol

from aibrix_kvcache.status import Status, StatusCodes

from ..link.sdk import HIT, MISS, Outcome

OK = Status.ok()
NOT_FOUND = Status(StatusCodes.NOT_FOUND)
# What a request gets while the circuit is open (no SDK call is made): a
# miss, or a skipped put or delete. Distinct objects, so the metrics can tell
# a fast failure from a miss EIC reported.
FAST_MISS = Status(StatusCodes.NOT_FOUND, "EIC circuit is open (EIC unavailable)")
PUT_SKIPPED = Status(StatusCodes.ERROR, "put skipped: EIC circuit is open (EIC unavailable)")
DELETE_SKIPPED = Status(StatusCodes.ERROR, "delete skipped: EIC circuit is open (EIC unavailable)")
_CODE_OUTCOMES = {StatusCodes.NOT_FOUND: "miss", StatusCodes.TIMEOUT: "timeout", StatusCodes.INVALID: "invalid"}


class Answered(Protocol):
    """An SDK call's share of a request once it ran: its keys, and its
    per-key outcomes (None: not answered in time)."""

    keys: list[str]
    outcomes: list[Outcome] | None
    detail: str


def key_statuses(chunks: Sequence[Answered], op: str, timeout_ms: float) -> tuple[list[Status], int]:
    """One Status per key, and the index of the first key that is not OK
    (the number of keys if none)."""
    statuses: list[Status] = []
    first_bad = -1
    timeout_status = None
    for chunk in chunks:
        outcomes = chunk.outcomes
        if outcomes is None:
            if timeout_status is None:
                timeout_status = Status(StatusCodes.TIMEOUT, f"{op} exceeded {op}_timeout_ms={timeout_ms:g}")
            if first_bad < 0:
                first_bad = len(statuses)
            statuses.extend([timeout_status] * len(chunk.keys))
            continue
        if outcomes.count(HIT) == len(outcomes):
            statuses.extend([OK] * len(outcomes))
            continue
        error_status = None
        for outcome in outcomes:
            if outcome == HIT:
                statuses.append(OK)
                continue
            if first_bad < 0:
                first_bad = len(statuses)
            if outcome == MISS:
                statuses.append(NOT_FOUND)
            else:
                if error_status is None:
                    error_status = Status(StatusCodes.ERROR, f"{op}: {chunk.detail}")
                statuses.append(error_status)
    return statuses, (len(statuses) if first_bad < 0 else first_bad)


def close_after(statuses: list[Status], first_bad: int) -> None:
    """Make statuses prefix-closed: nothing after the first non-OK is OK.

    L2Cache and the cache manager read the number of OKs as a loaded prefix,
    so an OK after a hole would hand the model a block it never got."""
    rest = len(statuses) - first_bad - 1
    if rest > 0:
        tail = Status(
            StatusCodes.NOT_FOUND,
            f"not loaded: block {first_bad} of {len(statuses)} was not ({statuses[first_bad].error_code.name})",
        )
        statuses[first_bad + 1 :] = [tail] * rest


def put_outcome(statuses: list[Status], first_bad: int) -> tuple[list[Status] | Status, int]:
    """What an mput returns, and how many blocks it stored.

    A list only when every block was stored: L2Cache 0.8 crashes on a list
    with a failure in it (it calls `.result()` on a Status), so anything less
    is one error Status naming how many blocks failed."""
    nkeys = len(statuses)
    if first_bad == nkeys:
        return statuses, nkeys
    stored = sum(1 for status in statuses if status.is_ok())
    reason = statuses[first_bad]
    return Status(
        reason.error_code,
        f"{nkeys - stored} of {nkeys} blocks not stored; first is block {first_bad}: {reason.value}",
    ), stored


def unloaded_reasons(chunks: Sequence[Any]) -> dict[str, int]:
    """get_errors and get_timeouts of one mget, from its dispatch chunks
    (`keys`, and `outcomes` or None when the deadline came first): keys EIC
    failed, and keys not answered in time. The other keys not loaded were
    misses, or came after a key that was not loaded."""
    errors = timeouts = 0
    for chunk in chunks:
        outcomes = chunk.outcomes
        if outcomes is None:
            timeouts += len(chunk.keys)
            continue
        hits = outcomes.count(HIT)
        if hits != len(outcomes):
            errors += len(outcomes) - hits - outcomes.count(MISS)
    return {"get_errors": errors, "get_timeouts": timeouts}


def _status_outcome(op: str, status: Status) -> str:
    if status is FAST_MISS or status is PUT_SKIPPED or status is DELETE_SKIPPED:
        return "fast_fail"
    code = status.error_code
    if code is StatusCodes.OK:
        return "hit" if op in ("get", "exists") else "ok"
    outcome = _CODE_OUTCOMES.get(code, "error")
    return "error" if outcome == "miss" and op == "put" else outcome


def request_outcome(op: str, result: Any) -> str:
    """The metrics' outcome label of one request (observability/families.py, REQUEST_OUTCOMES)
    from what the connector returned: a Status, or a list of them
    (prefix-closed for get)."""
    if isinstance(result, Status):
        return _status_outcome(op, result)
    if not result:
        return "hit" if op == "get" else "ok"
    first = result[0]
    if op == "get" and first.is_ok():
        return "hit" if result[-1].is_ok() else "partial"
    return _status_outcome(op, first)
