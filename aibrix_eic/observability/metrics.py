"""Prometheus metrics of the EIC connector, named `aibrix_eic_*`.

Every series carries the labels an operator filters on: `eic_namespace`
(the EIC namespace, eic_kv_ns; not `namespace`, which Prometheus sets to the
pod's Kubernetes namespace when it scrapes, and under which the Prometheus
Operator would rename ours to exported_namespace), `model` (the config's
model_id, "" without one) and `partition` (the TP rank's slice of AIBrix's
conn_id, e.g. `h0_7_l0_79`). Never a key.

Where they appear: vLLM's TP workers are processes of their own, and vLLM's
API server serves `/metrics` from a MultiProcessCollector when
PROMETHEUS_MULTIPROC_DIR is set (vllm/v1/metrics/prometheus.py,
https://github.com/vllm-project/vllm/blob/main/vllm/v1/metrics/prometheus.py;
vLLM sets the variable itself only with more than one API server). With the
variable set in the worker's environment, prometheus_client writes these
series to files there and they show up on vLLM's /metrics. Without it,
`metrics_port` in the config starts a per-process exporter instead.

Counters mirror the connector's health() counters: Counters.add forwards
each amount here, so both read the same numbers. Children are bound once
per connector, so an update on the hot path is one lock and one add.
"""

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from aibrix_kvcache.status import Status

from ..util.teardown import OwnThread
from .exporter import LOOPBACK, exporter_port, start_exporter
from .families import (
    BLOCK_OUTCOMES,
    EXISTS_REASK_OUTCOMES,
    INGESTION_OUTCOMES,
    LABELS,
    MULTIPROC_ENV,
    OPS,
    REQUEST_OUTCOMES,
    SAMPLE_INTERVAL_S,
    WRITE_BEHIND_OUTCOMES,
    families,
    partition_of,
)

__all__ = [
    "LABELS",
    "MULTIPROC_ENV",
    "NO_METRICS",
    "OPS",
    "ConnectorMetrics",
    "NoMetrics",
    "StoreUsage",
    "exporter_port",
    "for_connector",
    "partition_of",
    "publish_all",
    "start_exporter",
    "WRITE_BEHIND_OUTCOMES",
]


logger = logging.getLogger(__name__)


class StoreUsage(NamedTuple):
    """What a store says of its own fill, where it says it (link/sdk.py)."""

    used_bytes: int
    capacity_bytes: int
    evictions: int  # since the store was opened in this process


class ConnectorMetrics:
    """One connector's series, bound to its labels."""

    enabled = True

    def __init__(self, eic_namespace: str, model: str, partition: str) -> None:
        f = families()
        labels = (eic_namespace, model, partition)
        self.labels = dict(zip(LABELS, labels))
        self._requests = {
            (op, outcome): f.requests.labels(*labels, op, outcome)
            for op, outcomes in REQUEST_OUTCOMES.items()
            for outcome in outcomes
        }
        self._blocks = {
            (op, outcome): f.blocks.labels(*labels, op, outcome)
            for op, outcomes in BLOCK_OUTCOMES.items()
            for outcome in outcomes
        }
        self._seconds = {op: f.request_seconds.labels(*labels, op) for op in OPS}
        self._bytes_in = f.bytes.labels(*labels, "in")
        self._bytes_out = f.bytes.labels(*labels, "out")
        self._retries = f.retries.labels(*labels)
        self._gdr_resends = f.gdr_resends.labels(*labels)
        self._timeouts = f.timeouts.labels(*labels)
        self._breaker_open = f.breaker_open.labels(*labels)
        self._breaker_trips = f.breaker_trips.labels(*labels)
        self._in_flight = f.sdk_calls_in_flight.labels(*labels)
        self._sdk_calls = {op: f.sdk_calls.labels(*labels, op) for op in OPS}
        # SDK calls start and end on pool threads, several per request: they
        # are tallied here and published by the sampler thread, which keeps
        # them off the hot path (in multiprocess mode every series update is
        # a write to a memory-mapped file).
        self._calls_lock = threading.Lock()
        self._running = 0
        self._started = dict.fromkeys(OPS, 0)
        self._published = dict.fromkeys(OPS, 0)
        self._wb_pending_bytes = f.write_behind_pending_bytes.labels(*labels)
        self._wb_blocks = {
            field: f.write_behind_blocks.labels(*labels, outcome) for outcome, field in WRITE_BEHIND_OUTCOMES.items()
        }
        self._wb_waits = f.write_behind_waits.labels(*labels)
        self._wb_flushes = f.write_behind_flushes.labels(*labels)
        self._ingestion = {
            field: f.ingestion_blocks.labels(*labels, outcome) for outcome, field in INGESTION_OUTCOMES.items()
        }
        self._ingestion["ingestion_puts"] = f.ingestion_puts.labels(*labels)
        self._exists_reasks = {
            field: f.exists_reasks.labels(*labels, outcome) for outcome, field in EXISTS_REASK_OUTCOMES.items()
        }
        self.pending_bytes: Callable[[], int] | None = None  # read by the sampler
        self.store_usage: Callable[[], StoreUsage | None] | None = None  # read by the sampler
        self._store_series: tuple[Any, Any, Any] | None = None  # bound at the first reading
        self._evictions_seen = 0
        # Counters fields that map one to one onto a series.
        self._plain = {
            "retries": self._retries,
            "timeouts": self._timeouts,
            "write_behind_waits": self._wb_waits,
            "write_behind_flushes": self._wb_flushes,
            "gdr_resends": self._gdr_resends,
            **self._wb_blocks,
            **self._ingestion,
            **self._exists_reasks,
        }
        self._registered = f.registered_bytes.labels(*labels)
        self._open: Any = None  # bound at open(), with the identity label
        self._breaker_open.set(0)
        self._registered.set(0)

    def watch_pending_bytes(self, source: Callable[[], int]) -> None:
        """Sample the write-behind pending bytes from `source`."""
        self.pending_bytes = source

    def watch_store_usage(self, source: Callable[[], StoreUsage | None]) -> None:
        """Sample the store's usage from `source` (None: the store does not say)."""
        self.store_usage = source

    def _publish_store_usage(self, usage: StoreUsage) -> None:
        if self._store_series is None:  # the series exist from the first reading on, never as a made-up 0
            f, labels = families(), tuple(self.labels.values())
            self._store_series = (
                f.store_used_bytes.labels(*labels),
                f.store_capacity_bytes.labels(*labels),
                f.store_evictions.labels(*labels),
            )
        used, capacity, evictions = self._store_series
        used.set(usage.used_bytes)
        capacity.set(usage.capacity_bytes)
        # The store counts since it was opened here; a count below the last
        # one is a store opened anew, counting from 0 again.
        new = usage.evictions - self._evictions_seen if usage.evictions >= self._evictions_seen else usage.evictions
        if new:
            evictions.inc(new)
        self._evictions_seen = usage.evictions

    # ------------------------------------------------ from Counters.add
    def counted(self, amounts: Mapping[str, int]) -> None:
        """The health() counters just added, as series."""
        get_blocks = amounts.get("get_blocks")
        if get_blocks is not None:
            hits = amounts.get("get_hits", 0)
            errors = amounts.get("get_errors", 0)
            timeouts = amounts.get("get_timeouts", 0)
            self._inc_block("get", "hit", hits)
            self._inc_block("get", "error", errors)
            self._inc_block("get", "timeout", timeouts)
            # Not loaded for another reason: EIC had no such key, or the block
            # came after one that was not loaded (a get is a prefix).
            self._inc_block("get", "miss", get_blocks - hits - errors - timeouts)
        put_blocks = amounts.get("put_blocks")
        if put_blocks is not None:
            failures = amounts.get("put_failures", 0)
            self._inc_block("put", "ok", put_blocks - failures)
            self._inc_block("put", "error", failures)
        plain = self._plain
        for name, amount in amounts.items():  # a few per call: cheaper than looking up every series
            child = plain.get(name)
            if child is not None and amount:
                child.inc(amount)

    def _inc_block(self, op: str, outcome: str, amount: int) -> None:
        if amount > 0:
            self._blocks[op, outcome].inc(amount)

    # ----------------------------------------------------- per request
    def record_request(self, op: str, outcome: str, result: Any, args: tuple[Any, ...], seconds: float) -> None:
        """One request of AIBrix's, as the connector answered it (`outcome`:
        outcomes.request_outcome). args are the request's (keys, mrs) for get
        and put."""
        self._requests[op, outcome].inc()
        if op != "exists":  # timed per mexist round, in exists_seconds
            self._seconds[op].observe(seconds)
        if op == "get" and not isinstance(result, Status) and result:
            if outcome == "fast_fail":
                self._blocks["get", "fast_fail"].inc(len(result))
            elif outcome != "miss" and len(args) > 1:
                loaded = len(result) if outcome == "hit" else sum(1 for status in result if status.is_ok())
                self._bytes_in.inc(loaded * args[1][0].length)  # one request's blocks share one size
        elif op == "put" and len(args) > 1 and args[0]:
            if outcome == "fast_fail":
                self._blocks["put", "fast_fail"].inc(len(args[0]))
            elif outcome == "ok":
                self._bytes_out.inc(len(args[0]) * args[1][0].length)

    def count_requests(self, op: str, outcome: str, n: int) -> None:
        if n > 0:
            self._requests[op, outcome].inc(n)

    def exists_seconds(self, seconds: float) -> None:
        """The latency of one mexist round of the exists batcher."""
        self._seconds["exists"].observe(seconds)

    # ------------------------------------------------------ SDK calls
    def call_started(self, op: str) -> None:
        with self._calls_lock:
            self._running += 1
            self._started[op] += 1

    def call_finished(self) -> None:
        with self._calls_lock:
            self._running -= 1

    def publish(self) -> None:
        """Bring the sampled series up to date (the sampler thread does this
        every SAMPLE_INTERVAL_S; tests call it before they scrape)."""
        with self._calls_lock:
            running, started = self._running, dict(self._started)
        self._in_flight.set(running)
        pending_bytes = self.pending_bytes
        if pending_bytes is not None:
            self._wb_pending_bytes.set(pending_bytes())
        store_usage = self.store_usage
        if store_usage is not None:
            try:
                usage = store_usage()
            except Exception:  # a store that cannot answer now: the last reading stands
                logger.debug("EIC store usage unavailable", exc_info=True)
                usage = None
            if usage is not None:
                self._publish_store_usage(usage)
        for op, count in started.items():
            delta = count - self._published[op]
            if delta:
                self._sdk_calls[op].inc(delta)
                self._published[op] = count

    # ------------------------------------------------- state changes
    def breaker_changed(self, is_open: bool) -> None:
        self._breaker_open.set(1 if is_open else 0)
        if is_open:
            self._breaker_trips.inc()

    def registered(self, nbytes: int) -> None:
        self._registered.set(nbytes)

    def opened(self, identity: str) -> None:
        """open() succeeded; `identity`: the model identity token in the keys."""
        self._open = families().connector_open.labels(*self.labels.values(), identity)
        self._open.set(1)

    def closed(self) -> None:
        """The connector closed: nothing registered, no breaker to alert on."""
        if self._open is not None:
            self._open.set(0)
        self._registered.set(0)
        self._breaker_open.set(0)
        self.publish()
        self._wb_pending_bytes.set(0)  # close released every pending write's memory


_sampled: "weakref.WeakSet[ConnectorMetrics]" = weakref.WeakSet()
_sampler: threading.Thread | None = None
_sampler_lock = threading.Lock()


def _sample_forever() -> None:
    while True:
        time.sleep(SAMPLE_INTERVAL_S)
        publish_all()


def publish_all() -> None:
    """Publish every live connector's sampled series now."""
    for connector_metrics in list(_sampled):
        try:
            connector_metrics.publish()
        except Exception:  # a metrics hiccup must not end the sampler
            logger.debug("EIC metrics sampler failed", exc_info=True)


atexit.register(publish_all)  # what the last interval counted


def _sample(connector_metrics: ConnectorMetrics) -> None:
    global _sampler
    with _sampler_lock:
        _sampled.add(connector_metrics)
        if _sampler is None or not _sampler.is_alive():
            _sampler = OwnThread(_sample_forever, "aibrix_eic_metrics")
            _sampler.start()


class NoMetrics:
    """`metrics: false`: the same calls, doing nothing."""

    enabled = False
    labels: dict[str, str] = {}  # noqa: RUF012  (read-only: no labels)
    pending_bytes: Callable[[], int] | None = None

    def watch_pending_bytes(self, source: Callable[[], int]) -> None:
        pass  # shared by every connector without metrics: remembers nothing

    def watch_store_usage(self, source: Callable[[], StoreUsage | None]) -> None:
        pass

    def counted(self, amounts: Mapping[str, int]) -> None:
        pass

    def record_request(self, op: str, outcome: str, result: Any, args: tuple[Any, ...], seconds: float) -> None:
        pass

    def count_requests(self, op: str, outcome: str, n: int) -> None:
        pass

    def exists_seconds(self, seconds: float) -> None:
        pass

    def call_started(self, op: str) -> None:
        pass

    def call_finished(self) -> None:
        pass

    def publish(self) -> None:
        pass

    def breaker_changed(self, is_open: bool) -> None:
        pass

    def registered(self, nbytes: int) -> None:
        pass

    def opened(self, identity: str) -> None:
        pass

    def closed(self) -> None:
        pass


NO_METRICS = NoMetrics()


def for_connector(config: Any, conn_id: str) -> "ConnectorMetrics | NoMetrics":
    """The metrics of a connector with this config, or NO_METRICS when the
    config turns them off; starts the fallback exporter if configured."""
    if not getattr(config, "metrics", True):
        return NO_METRICS
    port = getattr(config, "metrics_port", None)
    if port is not None:
        start_exporter(port, getattr(config, "metrics_host", LOOPBACK))
    connector_metrics = ConnectorMetrics(
        config.eic_kv_ns, getattr(config, "model_id", None) or "", partition_of(conn_id)
    )
    _sample(connector_metrics)
    return connector_metrics
