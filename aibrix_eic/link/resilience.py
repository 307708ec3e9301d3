"""Deadlines, backoff, the circuit breaker and its recovery probe.

Small objects with one job each, in the manner of redis-py's retry.py and
backoff.py. The connector composes them; none of them knows about EIC.
"""

import enum
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..util.teardown import OwnThread

T = TypeVar("T")

logger = logging.getLogger(__name__)


class Deadline:
    """A point in monotonic time that an operation must finish by."""

    __slots__ = ("at",)

    def __init__(self, timeout_s: float) -> None:
        self.at = time.monotonic() + timeout_s

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self.at


def call_with_timeout(fn: Callable[[], T], timeout_s: float, name: str) -> tuple[bool, T | None]:
    """Run fn on a fresh daemon thread; (finished, result). A call that hangs
    is abandoned, so a stuck SDK cannot stall the caller or a shared pool."""
    box: list[T] = []
    thread = OwnThread(lambda: box.append(fn()), name)
    thread.start()
    thread.join(timeout_s)
    return (True, box[0]) if box else (False, None)


class ExponentialBackoff:
    """Equal-jitter exponential backoff: half fixed, half random, capped."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        self.base_s = base_s
        self.cap_s = cap_s

    def compute(self, failures: int) -> float:
        """Seconds to wait before retry number `failures` (1-based)."""
        ceiling = min(self.cap_s, self.base_s * (2 ** max(0, failures - 1)))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"


@dataclass(frozen=True)
class BreakerSnapshot:
    state: BreakerState
    consecutive_failures: int
    trips: int
    opened_at: float | None  # time.time() of the last trip while open
    reason: str  # why it last opened


class CircuitBreaker:
    """Opens after `threshold` consecutive signs that the service is down.

    Only whole-call failures and timeouts count; a reply that answered for
    any key (hit or miss) proves the service is up and resets the count, so
    a service that fails some keys keeps its cache. The breaker never
    resets by itself: Prober resets it after a successful probe.
    """

    def __init__(
        self,
        threshold: int,
        on_change: Callable[[BreakerState, str], None] | None = None,
    ) -> None:
        self.threshold = threshold
        self._on_change = on_change
        self._lock = threading.Lock()
        self._open = False
        self._failures = 0
        self._trips = 0
        self._opened_at: float | None = None
        self._reason = ""

    @property
    def tripped(self) -> bool:
        """True while requests must fail fast."""
        return self._open

    @property
    def state(self) -> BreakerState:
        return BreakerState.OPEN if self._open else BreakerState.CLOSED

    def record_success(self) -> None:
        if self._failures:
            with self._lock:
                self._failures = 0

    def record_failure(self, reason: str) -> None:
        with self._lock:
            self._failures += 1
            if self._open or self._failures < self.threshold:
                return
            self._set_open_unsafe(f"{self._failures} consecutive failures, last: {reason}")
        self._notify(BreakerState.OPEN)

    def trip(self, reason: str) -> None:
        """Open at once (init failed, for instance)."""
        with self._lock:
            if self._open:
                self._reason = reason
                return
            self._set_open_unsafe(reason)
        self._notify(BreakerState.OPEN)

    def reset(self) -> None:
        """Close the circuit: requests go to EIC again."""
        with self._lock:
            if not self._open:
                return
            self._open = False
            self._failures = 0
            self._opened_at = None
        self._notify(BreakerState.CLOSED)

    def snapshot(self) -> BreakerSnapshot:
        with self._lock:
            return BreakerSnapshot(
                state=self.state,
                consecutive_failures=self._failures,
                trips=self._trips,
                opened_at=self._opened_at,
                reason=self._reason,
            )

    def _set_open_unsafe(self, reason: str) -> None:
        self._open = True
        self._trips += 1
        self._opened_at = time.time()
        self._reason = reason

    def _notify(self, state: BreakerState) -> None:
        if self._on_change is not None:
            self._on_change(state, self._reason)


POLL_S = 0.2  # how soon the prober sees abandon()


class Prober:
    """A daemon thread that, while the breaker is open, calls `attempt`
    every `interval_s` and closes the breaker when it returns True."""

    def __init__(
        self,
        breaker: CircuitBreaker,
        attempt: Callable[[], bool],
        interval_s: float,
        name: str = "aibrix_eic_probe",
    ) -> None:
        self._breaker = breaker
        self._attempt = attempt
        self._interval_s = interval_s
        self._name = name
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._abandoned: Callable[[], None] | None = None  # see abandon()

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = OwnThread(self._run, self._name)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def abandon(self, then: Callable[[], None]) -> None:
        """stop() for a finalizer: one attribute write, no lock (Event.set
        takes one, which this very thread may hold if the GC runs on it).
        The thread sees it within POLL_S, runs `then` and exits."""
        self._abandoned = then

    def wake(self) -> None:
        """Start counting the interval now (the breaker just opened)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping(0):
            if not self._tripped():
                self._wake.wait(POLL_S)  # bounded: abandon() cannot set the event
                self._wake.clear()
                continue
            if self._stopping(self._interval_s):
                break
            if not self._tripped():  # a request closed it during the interval
                continue
            try:
                recovered = self._attempt()
            except Exception:  # the probe must outlive any SDK surprise
                logger.exception("EIC recovery probe raised")
                recovered = False
            if recovered and not self._stopping(0):
                self._breaker.reset()
        then = self._abandoned
        if then is not None:
            then()

    def _tripped(self) -> bool:
        """Read afresh each time: other threads open and close the breaker."""
        return self._breaker.tripped

    def _stopping(self, wait_s: float) -> bool:
        """Wait up to wait_s; True once stopped or abandoned."""
        end = time.monotonic() + wait_s
        while self._abandoned is None:
            if self._stop.wait(max(0.0, min(POLL_S, end - time.monotonic()))):
                return True
            if time.monotonic() >= end:
                return False
        return True
