"""The tier's transfers: one job is a batch of keys copied between EIC and
slots of vLLM's CPU primary tier, sent as SDK calls of at most
`keys_per_call` keys on the link's data pool (each through `Link.send`:
its retries, the breaker, the call counters), and reported once every
call of it has returned.

The rules that keep KV right (the adversary: an EIC that answers late or
never, a call that fails half way):
- A job is reported only after its last SDK call has returned (or was
  cancelled before it started). vLLM frees or reuses the job's primary
  slots once it hears of the job, so a call still running could copy
  another block's bytes into EIC (a store) or over a slot now holding
  another block (a load). A call the deadline left queued never starts.
- A key counts as loaded only when its mget answered HIT before the job's
  deadline; one that failed, missed or answered late is not loaded. A
  late store is reported failed as well, though its bytes are whole.
- A load reports which keys it copied (`loaded`), so vLLM keeps those.

No vLLM import here: the manager (manager.py) turns `Finished` into vLLM's
JobResult.
"""

import functools
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..config import EICConfig
from ..link.calls import GET, PUT, Operation
from ..link.link import Link
from ..link.resilience import Deadline
from ..link.sdk import FAIL, HIT, CallResult, Outcome, SdkBuffer, SdkClient
from ..observability.counters import Counters
from ..util.rate_limited_log import RateLimitedLogger

logger = logging.getLogger(__name__)
_rate_log = RateLimitedLogger(logger)


@dataclass(frozen=True)
class Finished:
    """A job every call of which has returned."""

    job_id: int
    is_load: bool
    loaded: tuple[int, ...]  # positions of the keys copied in full (a load), or stored (a store)
    nkeys: int
    seconds: float
    nbytes: int  # bytes moved by the keys that succeeded

    @property
    def success(self) -> bool:
        return len(self.loaded) == self.nkeys


@dataclass
class _Job:
    job_id: int
    op: Operation
    nkeys: int
    block_bytes: int
    deadline: Deadline
    calls_left: int
    started: float = field(default_factory=time.monotonic)
    outcomes: list[Outcome] = field(default_factory=list)
    late: bool = False

    def __post_init__(self) -> None:
        self.outcomes = [FAIL] * self.nkeys


class Transfers:
    """Jobs in flight and jobs finished; submit and poll from one thread
    (vLLM's scheduler), the calls run on the link's data pool."""

    def __init__(self, link: Link, config: EICConfig, counters: Counters) -> None:
        self._link = link
        self._config = config
        self._counters = counters
        self._finished: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._in_flight: dict[int, _Job] = {}  # under _idle

    # ---------------------------------------------------------- scheduler side
    def submit(self, job_id: int, is_load: bool, eic_keys: Sequence[str], buffers: Sequence[SdkBuffer]) -> None:
        """Queue one job; never blocks on EIC. With the circuit open or the
        link closed the job fails at once (a miss for a load)."""
        op = GET if is_load else PUT
        nkeys = len(eic_keys)
        block_bytes = buffers[0][1] if buffers else 0
        job = _Job(job_id, op, nkeys, block_bytes, Deadline(op.timeout_ms(self._config) / 1000), 0)
        usable = self._link.usable("data") if nkeys else None
        if usable is None:
            self._finish(job)
            return
        session, pool = usable
        step = self._link.keys_per_call(block_bytes)
        spans = [(start, min(start + step, nkeys)) for start in range(0, nkeys, step)]
        job.calls_left = len(spans)
        with self._idle:
            self._in_flight[job_id] = job
        for start, end in spans:
            try:
                future = pool.submit(
                    self._call,
                    job,
                    session.client,
                    list(eic_keys[start:end]),
                    list(buffers[start:end]),
                    priority=op.priority,
                )
            except RuntimeError:  # the pool was shut down: this span never runs
                self._call_done(job, start, None)
                continue
            future.add_done_callback(functools.partial(self._call_done, job, start))

    def finished(self) -> list[Finished]:
        """Jobs that finished since the last call."""
        done = []
        while True:
            try:
                done.append(self._finished.get_nowait())
            except queue.Empty:
                return done

    @property
    def busy(self) -> bool:
        """A job running, or finished and not yet polled."""
        return bool(self._in_flight) or not self._finished.empty()

    def wait_idle(self, timeout_s: float) -> list[int]:
        """Wait until no call of any job is running, at most timeout_s; the
        ids of the jobs still in flight (none: every job has finished)."""
        until = time.monotonic() + timeout_s
        with self._idle:
            while self._in_flight:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(left)
            return sorted(self._in_flight)

    # ------------------------------------------------------------ pool side
    def _call(self, job: _Job, client: SdkClient, keys: list[str], buffers: list[SdkBuffer]) -> CallResult | None:
        if job.deadline.expired():
            return None  # never started: touched no memory
        return self._link.send(job.op, client, keys, buffers, job.deadline)

    def _call_done(self, job: _Job, start: int, future: "Future[CallResult | None] | None") -> None:
        result = None
        if future is not None and not future.cancelled() and future.exception() is None:
            result = future.result()
        late = result is None or job.deadline.expired()
        with self._idle:
            if result is not None and not late:
                job.outcomes[start : start + len(result.outcomes)] = result.outcomes
            job.late = job.late or late
            job.calls_left -= 1
            if job.calls_left > 0:
                return
            self._in_flight.pop(job.job_id, None)
            self._idle.notify_all()
        self._finish(job)

    def _finish(self, job: _Job) -> None:
        ok = tuple(i for i, outcome in enumerate(job.outcomes) if outcome == HIT)
        if job.late and job.nkeys:
            self._link.deadline_passed(job.op.name, job.op.timeout_ms(self._config), f"tier {job.op.name}")
        if job.op is GET:
            self._counters.add(gets=1, get_blocks=job.nkeys, get_hits=len(ok))
        else:
            self._counters.add(puts=1, put_blocks=job.nkeys, put_failures=job.nkeys - len(ok))
        if len(ok) < job.nkeys:
            _rate_log.log(
                f"tier-{job.op.name}",
                logging.WARNING,
                "EIC tier %s: %d of %d keys not transferred (%s)",
                job.op.name,
                job.nkeys - len(ok),
                job.nkeys,
                "past its deadline" if job.late else "EIC failed or missed them",
            )
        self._finished.put(
            Finished(
                job.job_id,
                job.op is GET,
                ok,
                job.nkeys,
                time.monotonic() - job.started,
                len(ok) * job.block_bytes,
            )
        )
