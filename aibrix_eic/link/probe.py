"""Calls that judge the link rather than carry data: the breaker's recovery
probe (is EIC answering again? swap in a new client if the old one broke)
and the warm-up at open. Neither goes through Link.call: they decide the
breaker's state, they do not feed it.
"""

import logging
import os
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from ..config import ConfigError, EICConfig
from ..util.rate_limited_log import RateLimitedLogger
from .pool import PROBE_PRIORITY
from .resilience import call_with_timeout

if TYPE_CHECKING:
    from .link import Link, Session
    from .sdk import CallResult

logger = logging.getLogger(__name__)


class Recovery:
    """The prober's callback for one link."""

    def __init__(self, link: "Link", config: EICConfig, key_prefix: str, rate_log: RateLimitedLogger) -> None:
        self._link = link
        self._config = config
        self._key_prefix = key_prefix
        self._rate_log = rate_log
        self._call: Future[CallResult] | None = None  # the probe call waited on
        self._until = 0.0  # ...until then

    def probe(self) -> bool:
        """Prober callback: True when EIC answers a call run the way data
        calls run. Reuses the current client if it answers; builds a new one
        only when the current one's call failed outright (a call that hangs
        says nothing a new client would change), and lets go of a new one
        that does not answer."""
        session = self._link.session
        if session is not None:
            answer = self._answers(session)
            if answer is not False:
                return answer is True
        try:
            fresh, error = self._link.connect()
        except ConfigError as e:  # cannot happen after a successful open
            fresh, error = None, str(e)
        if fresh is None:
            self._rate_log.log("probe", logging.INFO, "EIC probe: still unavailable: %s", error)
            return False
        if self._answers(fresh) is not True:
            self._let_go(fresh)
            return False
        with self._link.state_lock:
            if not self._link.is_open:
                self._let_go(fresh)
                return False
            # Slabs may have been registered since connect() read the list.
            missing = [region for region in self._link.regions.all() if region not in fresh.regions]
            if missing:
                self._link.register_on(fresh, missing)
            self._link.session = fresh
        return True

    def _let_go(self, session: "Session") -> None:
        call = self._call
        if call is None or call.done():
            session.client.close()
        else:  # its probe call is still out: close once it returns
            call.add_done_callback(lambda _: session.client.close())

    def _answers(self, session: "Session") -> bool | None:
        """One mexist on the data pool, ahead of queued requests: the breaker
        may close only when a data call can actually be served. True: it
        answered; False: it failed; None: no answer in time, or the previous
        probe call is still within its deadline (one waited on at a time; a
        call past its deadline is left to the pool, which bounds stuck calls)."""
        pool = self._link.data_pool
        if pool is None:
            return None
        if self._call is not None and not self._call.done() and time.monotonic() < self._until:
            return None
        # An answer must come within one probe interval, or recovery lags by the wait.
        timeout_s = min(self._config.exists_timeout_ms / 1000, self._config.probe_interval_s)
        probe_key = f"{self._key_prefix}p{os.urandom(8).hex()}"
        try:
            call = self._call = pool.submit(session.client.mexist, [probe_key], priority=PROBE_PRIORITY)
        except RuntimeError:  # closed meanwhile
            return None
        self._until = time.monotonic() + timeout_s
        try:
            result = call.result(timeout=timeout_s)
        except FutureTimeout:
            return None
        except Exception:
            return False
        return not result.whole_call_failed


def warm_up(session: "Session", config: EICConfig, key_prefix: str) -> None:
    """One bounded mexist over random keys, so the SDK opens its agent
    connections now rather than on the first request. Best effort."""
    nkeys = config.warmup_keys
    if nkeys <= 0:
        return
    keys = [f"{key_prefix}w{os.urandom(12).hex()}" for _ in range(nkeys)]
    started = time.perf_counter()
    try:
        finished, result = call_with_timeout(
            lambda: session.client.mexist(keys), config.warmup_timeout_ms / 1000, "aibrix_eic_warmup"
        )
    except Exception as e:
        logger.warning("EIC warm-up skipped: %r", e)
        return
    if not finished or result is None:
        logger.warning("EIC warm-up did not finish within warmup_timeout_ms=%s", config.warmup_timeout_ms)
        return
    logger.info(
        "EIC warm-up: %d probe keys in one mexist, %.1f ms (%s)",
        nkeys,
        (time.perf_counter() - started) * 1000,
        "ok" if not result.whole_call_failed else result.detail,
    )
