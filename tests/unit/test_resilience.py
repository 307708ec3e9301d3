"""The small resilience objects on their own: breaker thresholds and state
changes, the prober's stop and wake, backoff bounds, deadlines."""

import threading
import time

from hypothesis import given
from hypothesis import strategies as st
from waiting import wait_until

from aibrix_eic.link.resilience import BreakerState, CircuitBreaker, Deadline, ExponentialBackoff, Prober


def recording_breaker(threshold: int):
    changes: list[tuple[BreakerState, str]] = []
    return CircuitBreaker(threshold, on_change=lambda state, reason: changes.append((state, reason))), changes


def test_breaker_trips_after_exactly_threshold_consecutive_failures():
    breaker, changes = recording_breaker(3)
    breaker.record_failure("a")
    breaker.record_failure("b")
    assert not breaker.tripped and changes == []
    breaker.record_failure("c")
    assert breaker.tripped and breaker.state is BreakerState.OPEN
    assert changes == [(BreakerState.OPEN, "3 consecutive failures, last: c")]


def test_a_success_resets_the_failure_count():
    breaker, _ = recording_breaker(2)
    breaker.record_failure("a")
    breaker.record_success()
    breaker.record_failure("b")
    assert not breaker.tripped
    assert breaker.snapshot().consecutive_failures == 1


def test_a_trip_while_open_updates_the_reason_but_counts_no_new_trip_and_notifies_nobody():
    breaker, changes = recording_breaker(5)
    breaker.trip("first")
    breaker.trip("second")
    breaker.record_failure("more")
    snapshot = breaker.snapshot()
    assert snapshot.trips == 1 and snapshot.reason == "second"
    assert [state for state, _ in changes] == [BreakerState.OPEN]


def test_reset_closes_once_and_a_reset_while_closed_does_nothing():
    breaker, changes = recording_breaker(1)
    breaker.reset()
    assert changes == []
    breaker.record_failure("x")
    breaker.reset()
    breaker.reset()
    assert not breaker.tripped and breaker.snapshot().opened_at is None
    assert [state for state, _ in changes] == [BreakerState.OPEN, BreakerState.CLOSED]
    assert breaker.state.value == "closed"


def test_prober_probes_only_while_open_and_resets_the_breaker_on_success():
    breaker, _ = recording_breaker(1)
    attempts = []
    answer = [False]

    def attempt():
        attempts.append(time.monotonic())
        return answer[0]

    prober = Prober(breaker, attempt, interval_s=0.02)
    prober.start()
    try:
        time.sleep(0.1)  # a window: five intervals in which nothing may happen
        assert attempts == []  # closed: nothing to probe
        breaker.trip("down")
        prober.wake()
        wait_until(lambda: len(attempts) >= 2, what="two probe attempts", show=lambda: attempts)
        assert breaker.tripped
        answer[0] = True
        wait_until(lambda: not breaker.tripped, what="the successful probe to close the breaker")
    finally:
        prober.stop()


def test_prober_stop_ends_its_thread_and_a_raising_attempt_does_not_kill_it():
    breaker, _ = recording_breaker(1)
    calls = []

    def attempt():
        calls.append(1)
        raise RuntimeError("SDK surprise")

    prober = Prober(breaker, attempt, interval_s=0.01, name="aibrix_eic_probe_test")
    breaker.trip("down")
    prober.start()
    wait_until(lambda: len(calls) >= 2, what="probing kept on after the first raise")
    prober.stop()
    wait_until(
        lambda: not any(thread.name == "aibrix_eic_probe_test" for thread in threading.enumerate()),
        what="the prober's thread to end",
    )


@given(
    base=st.floats(min_value=0.0001, max_value=1.0),
    cap=st.floats(min_value=0.0001, max_value=10.0),
    failures=st.integers(min_value=1, max_value=200),
)
def test_backoff_stays_within_half_and_all_of_its_capped_ceiling(base, cap, failures):
    ceiling = min(cap, base * 2 ** (failures - 1))
    delay = ExponentialBackoff(base, cap).compute(failures)
    assert ceiling / 2 <= delay <= ceiling


def test_deadline_counts_down_to_zero_and_expires():
    deadline = Deadline(0.05)
    assert 0 < deadline.remaining() <= 0.05 and not deadline.expired()
    time.sleep(0.06)
    assert deadline.remaining() == 0.0 and deadline.expired()
