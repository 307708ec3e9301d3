"""The per-process metrics exporter (`metrics_port`), for deployments where
vLLM's /metrics cannot show the workers' series (metrics.py says when)."""

import logging
import os
import threading

import prometheus_client

from .families import MULTIPROC_ENV

logger = logging.getLogger(__name__)

# How many ports above metrics_port a process tries: one per TP rank on a
# node of 8 GPUs, and some slack for other processes using the range.
EXPORTER_PORT_SPAN = 16
_exporter_port: int | None = None
_exporter_lock = threading.Lock()


def start_exporter(first_port: int) -> int | None:
    """Serve this process's metrics on the first free port from first_port
    (once per process; TP workers on one node take consecutive ports).
    Nothing is started in multiprocess mode, where vLLM's /metrics already
    has them. Returns the port, or None."""
    global _exporter_port
    with _exporter_lock:
        if _exporter_port is not None:
            return _exporter_port
        if os.environ.get(MULTIPROC_ENV):
            logger.info("metrics_port ignored: %s is set, so vLLM's /metrics serves the EIC metrics", MULTIPROC_ENV)
            return None
        last_error: OSError | None = None
        for port in range(first_port, first_port + EXPORTER_PORT_SPAN):
            try:
                prometheus_client.start_http_server(port)
            except OSError as e:  # taken by another rank or process
                last_error = e
                continue
            _exporter_port = port
            logger.info("EIC connector metrics on :%d/metrics (pid %d)", port, os.getpid())
            return port
        logger.warning(
            "EIC connector metrics: no free port in %d-%d (%s); metrics are not exported by this process",
            first_port,
            first_port + EXPORTER_PORT_SPAN - 1,
            last_error,
        )
        return None


def exporter_port() -> int | None:
    """The port this process serves its metrics on, if it does."""
    return _exporter_port
