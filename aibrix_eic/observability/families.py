"""The `aibrix_eic_*` series themselves: their names, labels and buckets,
the outcome labels of a request or a block (outcomes.request_outcome picks
a request's), and the one set of metric families a process registers
(metrics.py binds them per connector).
"""

import re
import threading

from prometheus_client import Counter, Gauge, Histogram

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SAMPLE_INTERVAL_S = 1.0  # how often sampled series are published
LABELS = ("eic_namespace", "model", "partition")
OPS = ("get", "put", "exists", "delete")
# Outcome of one request (one mget/mput/exists/delete call by AIBrix).
REQUEST_OUTCOMES = {
    "get": ("hit", "partial", "miss", "error", "timeout", "fast_fail", "invalid"),
    "put": ("ok", "error", "timeout", "fast_fail", "invalid"),
    "exists": ("hit", "miss", "error", "timeout", "fast_fail", "invalid"),
    "delete": ("ok", "miss", "error", "timeout", "fast_fail", "invalid"),
}
# Outcome of each block of a get or put request.
BLOCK_OUTCOMES = {
    "get": ("hit", "miss", "error", "timeout", "fast_fail"),
    "put": ("ok", "error", "fast_fail"),
}
# Outcomes of write-behind blocks, and the Counters field that counts each.
# Batched L1 ingestion (aibrix_compat/ingestion.py): blocks handed to L2, and
# those of them its puts did not store.
INGESTION_OUTCOMES = {"sent": "ingestion_blocks", "lost": "ingestion_lost"}
# Exists keys whose first mexist failed (a per-key TIMEOUT or a failed call,
# not a miss), asked once more (request/exists.py): answered hit or miss
# the second time, or failed again (then a miss, or an error if the call failed).
EXISTS_REASK_OUTCOMES = {"recovered": "exists_recovered", "failed": "exists_failed_again"}
WRITE_BEHIND_OUTCOMES = {
    "accepted": "write_behind_blocks",
    "lost": "write_behind_lost",
    "served": "write_behind_served",
}
# Request latency: from 0.25 ms (a hit on the embedded engine) to the
# longest deadline a config allows in practice.
LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

_PARTITION = re.compile(r"(?:^|_)(h\d+_\d+_l\d+_\d+)(?:_|$)")


def partition_of(conn_id: str) -> str:
    """The TP rank's part of AIBrix's conn_id (`{namespace}_h{first}_{last}
    _l{first}_{last}_{signatures}`, aibrix_kvcache/l2/l2_cache.py): its kv
    head and layer range. Other conn_ids are used whole."""
    match = _PARTITION.search(conn_id)
    return match.group(1) if match else conn_id


class _Families:
    """The metric families, created once per process (prometheus_client
    refuses a second registration of a name)."""

    def __init__(self) -> None:
        self.requests = Counter(
            "aibrix_eic_requests",
            "Requests AIBrix made of the connector, by operation and outcome.",
            (*LABELS, "op", "outcome"),
        )
        self.blocks = Counter(
            "aibrix_eic_blocks",
            "Blocks of get and put requests, by outcome (get: what AIBrix was told).",
            (*LABELS, "op", "outcome"),
        )
        self.bytes = Counter(
            "aibrix_eic_bytes",
            "Bytes of blocks read from EIC (in) and accepted for writing to it (out).",
            (*LABELS, "direction"),
        )
        self.request_seconds = Histogram(
            "aibrix_eic_request_seconds",
            "Latency of one request as AIBrix sees it, by operation.",
            (*LABELS, "op"),
            buckets=LATENCY_BUCKETS,
        )
        self.retries = Counter("aibrix_eic_retries", "Keys re-sent after failing in transit.", LABELS)
        self.gdr_resends = Counter(
            "aibrix_eic_gdr_resends",
            "Put keys refused as registered writes (GDR_TRANSFER_ERROR), re-sent unregistered.",
            LABELS,
        )
        self.exists_reasks = Counter(
            "aibrix_eic_exists_reasks",
            "Exists keys asked again once after their mexist failed (not a miss), by outcome of the second ask.",
            (*LABELS, "outcome"),
        )
        self.timeouts = Counter(
            "aibrix_eic_deadline_timeouts", "Requests (or exists rounds) whose deadline passed.", LABELS
        )
        self.breaker_open = Gauge(
            "aibrix_eic_breaker_open",
            "1 while the circuit breaker is open (requests fail fast), else 0.",
            LABELS,
            multiprocess_mode="mostrecent",
        )
        self.breaker_trips = Counter("aibrix_eic_breaker_trips", "Times the circuit breaker opened.", LABELS)
        # What `aibrix-eic status` reads a rank's state and key identity
        # from; "live": a dead worker's series leave vLLM's /metrics.
        self.connector_open = Gauge(
            "aibrix_eic_connector_open",
            "1 from a successful open() to close(), then 0; `identity` is the model identity in the keys.",
            (*LABELS, "identity"),
            multiprocess_mode="livemostrecent",
        )
        self.sdk_calls_in_flight = Gauge(
            "aibrix_eic_sdk_calls_in_flight",
            f"SDK calls running (sampled every {SAMPLE_INTERVAL_S:g} s).",
            LABELS,
            multiprocess_mode="livesum",
        )
        self.sdk_calls = Counter(
            "aibrix_eic_sdk_calls",
            f"SDK calls made, by operation (published every {SAMPLE_INTERVAL_S:g} s).",
            (*LABELS, "op"),
        )
        self.write_behind_pending_bytes = Gauge(
            "aibrix_eic_write_behind_pending_bytes",
            f"Bytes of accepted writes not yet confirmed by EIC (sampled every {SAMPLE_INTERVAL_S:g} s).",
            LABELS,
            multiprocess_mode="livesum",
        )
        self.write_behind_blocks = Counter(
            "aibrix_eic_write_behind_blocks",
            "Write-behind blocks: accepted before EIC stored them, lost (accepted, then not stored: a later "
            "miss), served (read from a pending write).",
            (*LABELS, "outcome"),
        )
        self.write_behind_waits = Counter(
            "aibrix_eic_write_behind_waits",
            "Puts that waited for their own flush: pending bytes were at the bound.",
            LABELS,
        )
        self.write_behind_flushes = Counter(
            "aibrix_eic_write_behind_flushes", "Flush rounds the write-behind flusher sent.", LABELS
        )
        # The store's own figures, only where the SDK module reports them
        # (the embedded engine; the vendor SDK has no such call, and the
        # series stay absent rather than read 0).
        self.store_used_bytes = Gauge(
            "aibrix_eic_store_used_bytes",
            f"Bytes the store holds against its capacity (sampled every {SAMPLE_INTERVAL_S:g} s; "
            "the embedded engine only).",
            LABELS,
            multiprocess_mode="mostrecent",
        )
        self.store_capacity_bytes = Gauge(
            "aibrix_eic_store_capacity_bytes",
            "The store's capacity in bytes (the embedded engine only).",
            LABELS,
            multiprocess_mode="mostrecent",
        )
        self.store_evictions = Counter(
            "aibrix_eic_store_evictions",
            "Values the store evicted to make room, by this process (the embedded engine only).",
            LABELS,
        )
        self.ingestion_blocks = Counter(
            "aibrix_eic_ingestion_blocks",
            "Blocks AIBrix's L1 ingestion handed to L2 in batched puts (sent), and those not stored (lost).",
            (*LABELS, "outcome"),
        )
        self.ingestion_puts = Counter(
            "aibrix_eic_ingestion_puts",
            "L2Cache.put calls of batched L1 ingestion (one per run of adjacent blocks per L1 call).",
            LABELS,
        )
        self.registered_bytes = Gauge(
            "aibrix_eic_registered_bytes",
            "Bytes of memory registered with EIC for zero-copy transfers.",
            LABELS,
            multiprocess_mode="mostrecent",
        )


_families: _Families | None = None
_families_lock = threading.Lock()


def families() -> _Families:
    global _families
    if _families is None:
        with _families_lock:
            if _families is None:
                _families = _Families()
    return _families
