"""Logging helpers: rate limits for paths that can fail thousands of times a
second, and routing our loggers into vLLM's log when we run inside vLLM."""

import logging
import sys
import threading
import time

PACKAGE_LOGGER = "aibrix_eic"
VLLM_LOGGER = "vllm"


class _VllmForwarder(logging.Handler):
    """Hands our records to the handlers vLLM's own logger has at emit time,
    so they come out in vLLM's format (process name, pid, level, time, file)
    and follow vLLM when it reconfigures logging (its engine and worker
    processes re-run dictConfig, which replaces the handler objects)."""

    def emit(self, record: logging.LogRecord) -> None:
        for handler in logging.getLogger(VLLM_LOGGER).handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


_forwarder = _VllmForwarder()


def route_to_vllm() -> bool:
    """Inside a process where vLLM set up its logging, send the aibrix_eic
    loggers to vLLM's handlers at vLLM's level. Elsewhere do nothing: plain
    `logging` applies, configured by the application.

    Never imports vLLM; idempotent and cheap (runs at every plugin load and
    connector-module import). Returns whether our loggers go to vLLM.
    """
    if "vllm.logger" not in sys.modules:
        return False
    vllm_logger = logging.getLogger(VLLM_LOGGER)
    if not vllm_logger.handlers:  # VLLM_CONFIGURE_LOGGING=0: the user owns logging
        return False
    ours = logging.getLogger(PACKAGE_LOGGER)
    if _forwarder not in ours.handlers:
        ours.addHandler(_forwarder)
    if ours.level == logging.NOTSET:
        ours.setLevel(vllm_logger.getEffectiveLevel())
    ours.propagate = False
    return True


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
