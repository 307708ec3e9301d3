"""The per-process metrics exporter (`metrics_port`, `metrics_host`), for
deployments where vLLM's /metrics cannot show the workers' series (metrics.py
says when).

It listens on 127.0.0.1 unless the config names another address: a port
opened on every interface of a worker is a choice the operator makes, not a
side effect of turning metrics on. A Prometheus scraping from another pod
needs `metrics_host: 0.0.0.0` (or the pod's IP); in Kubernetes a loopback
bind is logged as a warning, since no scrape can reach it."""

import errno
import ipaddress
import logging
import os
import threading

import prometheus_client

from ..util.docs import docs_url
from .families import MULTIPROC_ENV

logger = logging.getLogger(__name__)

# How many ports above metrics_port a process tries: one per TP rank on a
# node of 8 GPUs, and some slack for other processes using the range.
EXPORTER_PORT_SPAN = 16
LOOPBACK = "127.0.0.1"
_IN_KUBERNETES_ENV = "KUBERNETES_SERVICE_HOST"  # set by the kubelet in every container
_exporter_port: int | None = None
_exporter_lock = threading.Lock()


def start_exporter(first_port: int, host: str = LOOPBACK) -> int | None:
    """Serve this process's metrics on host, on the first free port from
    first_port (once per process; TP workers on one node take consecutive ports).
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
                prometheus_client.start_http_server(port, addr=host)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:  # taken by another rank or process
                    last_error = e
                    continue
                logger.warning(  # metrics_host is not an address of this host, or does not resolve
                    "EIC connector metrics: cannot listen on %s:%d (%s); check metrics_host", host, port, e
                )
                return None
            _exporter_port = port
            logger.info("EIC connector metrics on %s:%d/metrics (pid %d)", host, port, os.getpid())
            if os.environ.get(_IN_KUBERNETES_ENV) and is_loopback(host):
                logger.warning(
                    "EIC connector metrics listen on %s:%d, which a Prometheus in another pod cannot reach; "
                    "set metrics_host: 0.0.0.0 in the EIC YAML to have them scraped (%s)",
                    host,
                    port,
                    docs_url("operations.md", "metrics"),
                )
            return port
        logger.warning(
            "EIC connector metrics: no free port on %s in %d-%d (%s); metrics are not exported by this process",
            host,
            first_port,
            first_port + EXPORTER_PORT_SPAN - 1,
            last_error,
        )
        return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exporter_port() -> int | None:
    """The port this process serves its metrics on, if it does."""
    return _exporter_port
