"""The metrics exporter (metrics_port) listens where metrics_host says:
127.0.0.1 by default, every interface when asked. Each case runs in its
own process, as the exporter starts once per process."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from aibrix_eic.config import ConfigError, EICConfig

# Builds a connector's metrics from a config, as the connector does, and
# holds the exporter open until its stdin closes.
EXPORTER = textwrap.dedent(
    """
    import logging, sys
    from aibrix_eic.config import EICConfig
    from aibrix_eic.observability import metrics
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    values = {"remote_url": "local://", "metrics_port": int(sys.argv[1])}
    if sys.argv[2] != "-":
        values["metrics_host"] = sys.argv[2]
    metrics.for_connector(EICConfig.from_mapping(values), "rank0")
    print(metrics.exporter_port(), flush=True)
    sys.stdin.read()
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reachable(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(10)
        try:
            sock.connect((address, port))
        except OSError:
            return False
        return True


def serve(host: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int | None]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "KUBERNETES_SERVICE_HOST")}
    environ.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-c", EXPORTER, str(free_port()), host],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.isdigit() or line == "None", (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(line) if line.isdigit() else None


def started(host: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    proc, port = serve(host, env)
    assert port is not None, stop(proc)
    return proc, port


def stop(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(timeout=60)
    return err


# Linux routes all of 127.0.0.0/8 to the loopback interface: a socket bound to
# 127.0.0.1 does not answer on 127.0.0.2, one bound to 0.0.0.0 does.
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs 127.0.0.2 on loopback (Linux)")


@linux_only
def test_by_default_the_exporter_listens_on_loopback_only():
    proc, port = started("-")
    try:
        assert reachable("127.0.0.1", port)
        assert not reachable("127.0.0.2", port)
    finally:
        stop(proc)


@linux_only
def test_metrics_host_0_0_0_0_listens_on_every_interface():
    proc, port = started("0.0.0.0")
    try:
        assert reachable("127.0.0.1", port) and reachable("127.0.0.2", port)
    finally:
        assert "cannot reach" not in stop(proc)


@linux_only
def test_metrics_host_names_the_one_address_listened_on():
    proc, port = started("127.0.0.2")
    try:
        assert reachable("127.0.0.2", port) and not reachable("127.0.0.1", port)
    finally:
        stop(proc)


def test_in_kubernetes_a_loopback_exporter_warns_that_no_scrape_reaches_it():
    proc, port = started("-", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    err = stop(proc)
    assert f"listen on 127.0.0.1:{port}, which a Prometheus in another pod cannot reach" in err
    assert "metrics_host: 0.0.0.0" in err


def test_an_address_not_on_this_host_is_a_warning_not_a_crash():
    proc, port = serve("192.0.2.1")  # TEST-NET-1: never a local address
    assert port is None and "cannot listen on 192.0.2.1" in stop(proc)


@pytest.mark.parametrize("host, expected", [("0.0.0.0", "0.0.0.0"), ("::", "::"), ("metrics.local", "metrics.local")])
def test_metrics_host_takes_addresses_and_host_names(host, expected):
    assert EICConfig.from_mapping({"remote_url": "local://", "metrics_host": host}).metrics_host == expected
    assert EICConfig().metrics_host == "127.0.0.1"


@pytest.mark.parametrize("host", ["", "0.0.0.0:9400", "http://x", "999.1.1.1", 8])
def test_metrics_host_refuses_what_is_not_an_address(host):
    with pytest.raises(ConfigError) as info:
        EICConfig.from_mapping({"remote_url": "local://", "metrics_host": host})
    assert info.value.key == "metrics_host" and info.value.fix.startswith("write an IP address or a host name")
