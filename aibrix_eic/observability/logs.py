"""Routing our loggers into vLLM's log when we run inside vLLM (the rate
limit for hot paths is util/rate_limited_log.py)."""

import logging
import sys

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
