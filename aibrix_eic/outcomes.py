"""The rules that decide what AIBrix sees: per-key SDK outcomes become
Statuses, mget results are prefix-closed, a put that stored less than every
block becomes one error Status, and waiters get answers. Pure functions, no
state, so each rule can be tested without an engine.
"""

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol

from aibrix_kvcache.status import Status, StatusCodes

from .sdk import HIT, MISS, CallResult, Outcome

OK = Status.ok()
NOT_FOUND = Status(StatusCodes.NOT_FOUND)


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


def answer(waiters: Sequence[asyncio.Future], start: int, end: int, status: Status) -> None:
    for waiter in waiters[start:end]:
        if not waiter.done():  # AIBrix may have cancelled it
            waiter.set_result(status)


def answer_exists(waiters: Sequence[asyncio.Future], start: int, end: int, future: Future) -> None:
    """Answer waiters[start:end] from a finished mexist future."""
    if future.cancelled():
        # By the timeout (its waiters are answered, and skipped here) or by
        # close() shutting the pool down, which must not leave anyone waiting.
        answer(waiters, start, end, Status(StatusCodes.CANCELLED, "exists cancelled: the connector was closed"))
        return
    error = future.exception()
    if error is not None:
        answer(waiters, start, end, Status(StatusCodes.ERROR, f"exists failed internally: {error!r}"))
        return
    result: CallResult = future.result()
    failure = None
    for waiter, outcome in zip(waiters[start:end], result.outcomes):
        if waiter.done():
            continue
        if outcome == HIT:
            waiter.set_result(OK)
        elif outcome == MISS:
            waiter.set_result(NOT_FOUND)
        else:
            failure = failure or Status(StatusCodes.ERROR, f"exists: {result.detail}")
            waiter.set_result(failure)
