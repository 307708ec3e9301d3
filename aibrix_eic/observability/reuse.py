"""How much KV each get request reused, in vLLM's log: the counterpart of
LMCache's per-request "hit tokens" line, in blocks since the connector sees
blocks, not tokens (AIBrix's own `reused N tokens` line has the tokens).

One DEBUG line per get request, and at INFO a summary of the gets since the
last one, at most every `interval_s` and only while gets arrive, so a busy
worker writes one INFO line a minute, not one per request. Never a key.
Logger `aibrix_eic.observability.reuse`: set it to WARNING to silence the summaries, to
DEBUG for every request.
"""

import logging
import threading
import time
from collections.abc import Callable

from ..util.units import format_size

logger = logging.getLogger(__name__)


class ReuseLog:
    """Counts the blocks get requests asked for and loaded, and logs them."""

    def __init__(
        self,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger = logger,
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._log = log
        self._lock = threading.Lock()
        self._since = clock()
        self._gets = self._asked = self._loaded = self._bytes = 0

    def get(self, asked: int, loaded: int, nbytes: int, seconds: float) -> None:
        """One get request: `loaded` of its `asked` blocks (a prefix), `nbytes` read."""
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug(
                "EIC get: %d of %d blocks loaded (%s) in %.2f ms", loaded, asked, format_size(nbytes), seconds * 1e3
            )
        now = self._clock()
        with self._lock:
            self._gets += 1
            self._asked += asked
            self._loaded += loaded
            self._bytes += nbytes
            elapsed = now - self._since
            if elapsed < self._interval_s:
                return
            gets, asked_total, loaded_total, read = self._gets, self._asked, self._loaded, self._bytes
            self._since = now
            self._gets = self._asked = self._loaded = self._bytes = 0
        if self._log.isEnabledFor(logging.INFO):
            self._log.info(
                "EIC reuse, last %.0f s: %d get requests loaded %d of %d blocks (%.1f%%), %s",
                elapsed,
                gets,
                loaded_total,
                asked_total,
                100.0 * loaded_total / asked_total if asked_total else 0.0,
                format_size(read),
            )
