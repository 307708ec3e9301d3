"""The data path's side of the link (Link's base class): the one question
every request asks first (`usable`), the one path every data-path SDK call
takes (`call`; `send` adds the bounded retries of failed keys), and the one
"deadline passed" rule. The direct path's dispatch (request/dispatch.py), the
exists batcher and the write-behind rounds all send through here, so a retry,
a breaker observation or a call counted in `sdk_calls` means the same on
every path. link.py builds and tears down what these methods read.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import EICConfig
from ..observability.counters import Counters
from ..observability.metrics import ConnectorMetrics, NoMetrics
from ..util.rate_limited_log import RateLimitedLogger
from .pool import GET_PRIORITY, PUT_PRIORITY, PriorityThreadPool
from .resilience import CircuitBreaker, Deadline, ExponentialBackoff
from .sdk import FAIL, MISS, CallResult, Outcome, SdkBuffer, SdkClient

if TYPE_CHECKING:
    from .link import Session


def failed_before_first_miss(outcomes: list[Outcome]) -> list[int]:
    """Get retry rule: keys after a miss cannot be reported loaded, so
    refetching them is waste."""
    end = outcomes.index(MISS) if MISS in outcomes else len(outcomes)
    return [i for i in range(end) if outcomes[i] == FAIL]


def failed(outcomes: list[Outcome]) -> list[int]:
    """Put and delete retry rule: every key that failed in transit."""
    return [i for i, outcome in enumerate(outcomes) if outcome == FAIL]


SdkCall = Callable[[SdkClient, list[str], list[SdkBuffer]], CallResult]


@dataclass(frozen=True)
class Operation:
    """How one kind of SDK call is sent."""

    name: str  # "get", "put", "delete": also the `<name>_timeout_ms` key
    call: SdkCall
    retryable: Callable[[list[Outcome]], list[int]]
    metadata: bool = False  # on the small metadata pool, not the data pool
    priority: int = GET_PRIORITY
    resend_unregistered: bool = False  # keys refused with GDR_TRANSFER_ERROR go again unregistered

    def timeout_ms(self, config: EICConfig) -> float:
        return getattr(config, f"{self.name}_timeout_ms")


GET = Operation("get", lambda client, keys, buffers: client.mget(keys, buffers), failed_before_first_miss)
PUT = Operation(
    "put",
    lambda client, keys, buffers: client.mset(keys, buffers),
    failed,
    priority=PUT_PRIORITY,
    resend_unregistered=True,
)
DELETE = Operation("delete", lambda client, keys, _: client.mdel(keys), failed, metadata=True)


class LinkCalls:
    """What a request does with the link; Link (link.py) sets these up."""

    _config: EICConfig
    _counters: Counters
    _rate_log: RateLimitedLogger
    _backoff: ExponentialBackoff
    metrics: ConnectorMetrics | NoMetrics
    breaker: CircuitBreaker
    session: "Session | None"
    data_pool: PriorityThreadPool | None
    meta_pool: PriorityThreadPool | None

    def usable(self, pool: str = "data", count: bool = True) -> "tuple[Session, PriorityThreadPool] | None":
        """The session and the pool ("data" or "meta") a request may use now,
        or None while the circuit is open or the link is down, counted as a
        fast failure unless `count` is False (the flusher's watcher asking).
        Every path asks this one question; while EIC is down it is a
        request's whole cost."""
        session = self.session
        chosen = self.data_pool if pool == "data" else self.meta_pool
        if self.breaker.tripped or session is None or chosen is None:
            if count:
                self._counters.add(fast_fails=1)
            return None
        return session, chosen

    def keys_per_call(self, block_nbytes: int) -> int:
        """How many keys one SDK call carries: `batch_keys`, fewer for big
        blocks (`batch_bytes`), so their copies run on several threads."""
        step = self._config.batch_keys
        if block_nbytes:
            step = max(1, min(step, self._config.batch_bytes // block_nbytes))
        return step

    def call(self, op: str, fn: Callable[..., CallResult], *args: Any) -> CallResult:
        """Run one SDK call of the data path (`op`: get, put, exists, delete):
        counted in the sdk_calls series and the in-flight gauge, and its reply
        observed by the breaker. Every data-path SDK call goes through here;
        probes and the warm-up do not (they judge the breaker, not feed it)."""
        metrics = self.metrics
        metrics.call_started(op)
        try:
            result = fn(*args)
        finally:
            metrics.call_finished()
        self.observe(result)
        return result

    def send(
        self, op: Operation, client: SdkClient, keys: list[str], buffers: list[SdkBuffer], deadline: Deadline
    ) -> CallResult:
        """One SDK call of `op`, then its failed keys (never misses) again
        while the retry budget, the deadline and the breaker allow; one
        outcome per key. Never raises: a bug fails every key. A registered
        write the GDR path refused is marked unregistered in `buffers`."""
        try:
            return self._send_with_retries(op, client, keys, buffers, deadline)
        except BaseException as e:  # a bug here must still yield an answer
            self._rate_log.log("chunk-internal", logging.ERROR, "EIC call failed internally: %r", e)
            return CallResult([FAIL] * len(keys), True, f"internal error {e!r}")

    def _send_with_retries(
        self, op: Operation, client: SdkClient, keys: list[str], buffers: list[SdkBuffer], deadline: Deadline
    ) -> CallResult:
        result = self.call(op.name, op.call, client, keys, buffers)
        if result.gdr_refused and op.resend_unregistered:
            result = self._resend_unregistered(op, client, keys, buffers, None, result, deadline)
        outcomes, detail = list(result.outcomes), result.detail
        for attempt in range(1, self._config.retry_attempts + 1):
            again = op.retryable(outcomes)
            if not again or self.breaker.tripped:
                break
            delay = self._backoff.compute(attempt)
            if deadline.remaining() <= delay:
                break
            time.sleep(delay)
            self._counters.add(retries=len(again))
            resent = [buffers[i] for i in again] if buffers else []
            result = self.call(op.name, op.call, client, [keys[i] for i in again], resent)
            if result.gdr_refused and op.resend_unregistered:
                result = self._resend_unregistered(op, client, keys, buffers, again, result, deadline)
            for j, i in enumerate(again):
                outcomes[i] = result.outcomes[j]
            detail = result.detail
        return CallResult(outcomes, False, detail)

    def _resend_unregistered(
        self,
        op: Operation,
        client: SdkClient,
        keys: list[str],
        buffers: list[SdkBuffer],
        sent: list[int] | None,
        result: CallResult,
        deadline: Deadline,
    ) -> CallResult:
        """Send again, at once and unregistered, the registered writes of
        `result` (for the keys at `sent`, None for all) that EIC refused with
        GDR_TRANSFER_ERROR: the registered transfer path failed, not the
        store. Their later retries stay unregistered too."""
        positions = []  # into result
        for j in result.gdr_refused:
            i = j if sent is None else sent[j]
            addr, nbytes, registered = buffers[i]
            if registered:
                buffers[i] = (addr, nbytes, False)
                positions.append(j)
        if not positions or self.breaker.tripped or deadline.expired():
            return result
        indices = positions if sent is None else [sent[j] for j in positions]
        self._counters.add(gdr_resends=len(indices))
        self._rate_log.log(
            "gdr-resend",
            logging.WARNING,
            "EIC refused %d registered writes with GDR_TRANSFER_ERROR; re-sending them unregistered "
            "(put_registered: false skips the registered attempt)",
            len(indices),
        )
        resent = self.call(op.name, op.call, client, [keys[i] for i in indices], [buffers[i] for i in indices])
        outcomes = list(result.outcomes)
        for k, j in enumerate(positions):
            outcomes[j] = resent.outcomes[k]
        detail = f"{result.detail}; re-sent unregistered: {resent.detail}"
        return CallResult(outcomes, result.whole_call_failed and resent.whole_call_failed, detail)

    def deadline_passed(self, op: str, timeout_ms: float, what: str | None = None) -> None:
        """A request's (or a flush round's) deadline passed before its SDK
        calls answered: counted, a breaker failure, and a rate-limited warning."""
        self._counters.add(timeouts=1)
        self.breaker.record_failure(f"{op} exceeded {op}_timeout_ms={timeout_ms:g}")
        what = what or op
        self._rate_log.log(f"{what}-timeout", logging.WARNING, "EIC %s exceeded %s_timeout_ms=%g", what, op, timeout_ms)

    def observe(self, result: CallResult) -> None:
        """Breaker accounting for one SDK reply."""
        if result.whole_call_failed:
            self.breaker.record_failure(result.detail)
            self._rate_log.log("call-failed", logging.WARNING, "EIC call failed: %s", result.detail)
        else:
            self.breaker.record_success()
