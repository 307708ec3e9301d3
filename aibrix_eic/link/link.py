"""The link to EIC: one SDK client and its memory registrations, the thread
pools that run SDK calls, the circuit breaker (its probe is in probe.py).
What a request does with them, the one path every data-path SDK call takes
(`usable`, `call`, `send`, `deadline_passed`), is the base class, in calls.py.

Everything here changes under one state lock: open and close, a probe
swapping in a new client, register_slabs. Requests read `session` once and
use that object to the end, so a swap never changes a client under a call.
"""

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from aibrix_kvcache.status import Status, StatusCodes

from ..config import ConfigError, EICConfig
from ..observability.counters import Counters
from ..observability.metrics import StoreUsage
from ..util.rate_limited_log import RateLimitedLogger
from .calls import LinkCalls
from .pool import PriorityThreadPool
from .probe import Recovery, warm_up
from .regions import RegisteredRegions
from .resilience import BreakerState, CircuitBreaker, ExponentialBackoff, Prober
from .sdk import SdkClient

logger = logging.getLogger(__name__)

_OK = Status.ok()
META_THREADS = 4  # exists, delete: small calls kept off the data pool
FLUSH_POLL_S = 0.02  # how often an abandoned link looks whether the last writes went out


@dataclass
class Session:
    client: SdkClient
    registration_ok: bool = True  # no register_memory on this client failed
    regions: set[tuple[int, int]] = dataclasses.field(default_factory=set)  # registered on it


class Link(LinkCalls):
    def __init__(
        self,
        config: EICConfig,
        module: ModuleType | None,
        key_prefix: str,
        counters: Counters,
        rate_log: RateLimitedLogger,
    ) -> None:
        self._config = config
        self._module = module
        self._key_prefix = key_prefix
        self._counters = counters
        self._rate_log = rate_log
        self._backoff = ExponentialBackoff(config.retry_backoff_ms / 1000, config.retry_backoff_max_ms / 1000)
        self.metrics = counters.metrics
        self.regions = RegisteredRegions()
        self.state_lock = threading.RLock()
        self.is_open = False
        self.session: Session | None = None
        self.data_pool: PriorityThreadPool | None = None
        self.meta_pool: PriorityThreadPool | None = None
        self._recovery = Recovery(self, config, key_prefix, rate_log)
        self._new_breaker()

    # ----------------------------------------------------------- lifecycle
    def open(self) -> Status:
        """Connect and start the pools and the prober, all or nothing. With
        fail_open an unreachable EIC is no error: the breaker starts open."""
        with self.state_lock:
            if self.is_open:
                return _OK
            try:
                session, error = self.connect()
            except ConfigError as e:
                return Status(StatusCodes.INVALID, str(e))
            if session is None and not self._config.fail_open:
                return Status(StatusCodes.ERROR, f"EIC open failed: {error}")
            try:
                self._start(session, error)
            except Exception as e:  # out of threads, for instance
                self._stop()
                if session is not None:
                    session.client.close()
                return Status(StatusCodes.ERROR, f"EIC open failed: {e!r}")
        if session is not None:
            warm_up(session, self._config, self._key_prefix)
        return _OK

    def _start(self, session: Session | None, error: str) -> None:
        config = self._config
        # A thread busy past every deadline of its pool is stuck: replaced, up to twice the pool.
        self.data_pool = PriorityThreadPool(
            config.eic_thread_num,
            "aibrix_eic_data",
            stuck_after_s=max(config.get_timeout_ms, config.put_timeout_ms) / 1000,
            max_threads=2 * config.eic_thread_num,
        )
        self.meta_pool = PriorityThreadPool(
            META_THREADS,
            "aibrix_eic_meta",
            stuck_after_s=max(config.exists_timeout_ms, config.delete_timeout_ms) / 1000,
            max_threads=2 * META_THREADS,
        )
        self._new_breaker()
        self.session = session
        self.is_open = True
        if session is None:
            self.breaker.trip(f"open: {error}")
        self._prober.start()

    def _stop(self) -> None:
        self.is_open = False
        self._prober.stop()
        self.session = None
        for pool in (self.data_pool, self.meta_pool):
            if pool is not None:
                pool.shutdown()
        self.data_pool = self.meta_pool = None

    def store_usage(self) -> StoreUsage | None:
        """The connected store's usage where it reports it (the sampler's source)."""
        session = self.session
        return None if session is None else session.client.store_usage()

    def close(self) -> None:
        with self.state_lock:
            self.regions.clear()
            if self.is_open:
                self._stop()

    def abandon(self, flushed: Callable[[], bool], flush_s: float) -> None:
        """close() for a finalizer: takes no lock and waits for nothing
        (util/teardown.py). The prober thread sees it within POLL_S, waits
        until `flushed()` (the write-behind's last sends use the pools) or
        flush_s passed, then shuts the pools down; their threads exit once
        their calls return."""
        if not self.is_open:
            return
        self.is_open = False
        prober, pools = self._prober, (self.data_pool, self.meta_pool)
        until = time.monotonic() + flush_s

        def retire() -> None:
            while not flushed() and time.monotonic() < until:
                time.sleep(FLUSH_POLL_S)
            self._retire(prober, pools)

        prober.abandon(retire)

    def _retire(self, prober: Prober, pools: tuple[PriorityThreadPool | None, ...]) -> None:
        """The rest of an abandoned close, on its prober's thread (which holds nothing now)."""
        for pool in pools:
            if pool is not None:
                pool.shutdown()
        with self.state_lock:
            if self._prober is not prober:
                return  # reopened since: the new pools and client are not ours to drop
            self.session = None
            self.data_pool = self.meta_pool = None
            self.regions.clear()
        self.metrics.closed()

    # -------------------------------------------------------- registration
    def register(self, regions: list[tuple[int, int]], cuda_device: int | None) -> tuple[int, str]:
        """Remember regions and register the new ones on the current client
        (again on every client made later). (bytes newly registered, error)."""
        with self.state_lock:  # against a probe swapping in a new client
            new_regions = self.regions.add(regions, cuda_device)
            session = self.session
            if session is None or not new_regions:
                return 0, ""
            return sum(n for _, n in new_regions), self.register_on(session, new_regions)

    def register_on(self, session: Session, regions: list[tuple[int, int]]) -> str:
        ok, message = session.client.register(regions, self.regions.cuda_device)
        if ok:
            session.regions.update(regions)
            return ""
        session.registration_ok = False
        logger.warning("EIC %s; buffers are passed as unregistered", message)
        return message

    def connect(self) -> tuple[Session | None, str]:
        if self._module is None:  # the config named no usable SDK; open() refuses before this
            return None, "no EIC SDK module"
        client, error = SdkClient.connect(self._module, self._config)
        if client is None:
            return None, error
        session = Session(client)
        regions = self.regions.all()
        if regions:
            error = self.register_on(session, regions)
            if error and self._config.require_registration:
                return None, error
        return session, ""

    # ------------------------------------------------------ breaker, probe
    def _new_breaker(self) -> None:
        # A new breaker per open(): a closed-and-reopened connector starts clean.
        self.breaker = CircuitBreaker(self._config.breaker_failures, on_change=self._on_breaker_change)
        self._prober = Prober(self.breaker, self._recovery.probe, self._config.probe_interval_s)

    def _on_breaker_change(self, state: BreakerState, reason: str) -> None:
        self.metrics.breaker_changed(state is BreakerState.OPEN)
        if state is BreakerState.OPEN:
            logger.warning(
                "EIC circuit OPEN for %s (%s): gets and exists return NOT_FOUND, puts are "
                "skipped, until a probe (every %gs) sees EIC answer again",
                self._config.remote_url,
                reason,
                self._config.probe_interval_s,
            )
            self._prober.wake()
        else:
            logger.warning("EIC circuit CLOSED for %s: EIC answers again, cache resumed", self._config.remote_url)
