"""A logger wrapper for paths that can fail thousands of times a second."""

import logging
import threading
import time


class RateLimitedLogger:
    """Logs a message of a given kind at most once per `interval_s`, and says
    how many of that kind were suppressed in between."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, kind: str, level: int, msg: str, *args: object) -> None:
        if not self._logger.isEnabledFor(level):
            return
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval_s:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            msg = f"{msg} ({suppressed} similar messages suppressed)"
        self._logger.log(level, msg, *args, stacklevel=2)  # the caller's file:line
