"""Our loggers go to vLLM's handlers inside vLLM, and stay plain logging outside."""

import io
import logging
import sys
import types

import pytest

from aibrix_eic.observability import logs
from aibrix_eic.util.rate_limited_log import RateLimitedLogger


@pytest.fixture
def loggers(monkeypatch):
    """The aibrix_eic and vllm loggers, restored after the test."""
    ours = logging.getLogger(logs.PACKAGE_LOGGER)
    vllm = logging.getLogger(logs.VLLM_LOGGER)
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in (ours, vllm)]
    yield ours, vllm
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


def _vllm_handler() -> tuple[logging.Handler, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        logging.Formatter("(VLLMFMT pid=%(process)d) %(levelname)s [%(filename)s:%(lineno)d] %(message)s")
    )
    handler.setLevel(logging.INFO)
    return handler, stream


def test_outside_vllm_nothing_changes(loggers, monkeypatch):
    ours, _ = loggers
    monkeypatch.delitem(sys.modules, "vllm.logger", raising=False)
    handlers = ours.handlers[:]
    assert logs.route_to_vllm() is False
    assert ours.handlers == handlers
    assert "vllm" not in sys.modules  # route_to_vllm never imports vLLM


def test_inside_vllm_records_use_vllms_handler_and_follow_reconfiguration(loggers, monkeypatch):
    ours, vllm = loggers
    monkeypatch.setitem(sys.modules, "vllm.logger", types.ModuleType("vllm.logger"))
    first, first_stream = _vllm_handler()
    vllm.handlers[:] = [first]
    vllm.setLevel(logging.INFO)
    ours.setLevel(logging.NOTSET)

    assert logs.route_to_vllm() is True
    assert logs.route_to_vllm() is True  # idempotent: one forwarder
    assert sum(isinstance(h, logs._VllmForwarder) for h in ours.handlers) == 1
    logging.getLogger("aibrix_eic.connector").info("EIC connector open: remote_url=%s", "local://")
    logging.getLogger("aibrix_eic.link.link").debug("not at vLLM's level")
    out = first_stream.getvalue()
    assert "INFO [test_logs_vllm.py:" in out and "EIC connector open: remote_url=local://" in out
    assert out.startswith("(VLLMFMT pid=")
    assert "not at vLLM's level" not in out

    # vLLM's engine and worker processes re-run dictConfig: new handler objects
    second, second_stream = _vllm_handler()
    vllm.handlers[:] = [second]
    logging.getLogger("aibrix_eic.link.link").warning("EIC circuit OPEN for %s", "local://")
    assert "WARNING [test_logs_vllm.py:" in second_stream.getvalue()
    assert "circuit OPEN" not in first_stream.getvalue()


def test_vllm_without_configured_logging_leaves_ours_alone(loggers, monkeypatch):
    ours, vllm = loggers
    monkeypatch.setitem(sys.modules, "vllm.logger", types.ModuleType("vllm.logger"))
    vllm.handlers[:] = []  # VLLM_CONFIGURE_LOGGING=0
    assert logs.route_to_vllm() is False
    assert not any(isinstance(h, logs._VllmForwarder) for h in ours.handlers)


def test_rate_limited_lines_name_their_caller(loggers, monkeypatch):
    ours, vllm = loggers
    monkeypatch.setitem(sys.modules, "vllm.logger", types.ModuleType("vllm.logger"))
    handler, stream = _vllm_handler()
    vllm.handlers[:] = [handler]
    vllm.setLevel(logging.INFO)
    ours.setLevel(logging.NOTSET)
    logs.route_to_vllm()
    RateLimitedLogger(logging.getLogger("aibrix_eic.link.link")).log("k", logging.WARNING, "EIC call failed: %s", "x")
    assert "[test_logs_vllm.py:" in stream.getvalue(), stream.getvalue()
