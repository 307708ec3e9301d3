"""Operation counters: what `EICConnector.health()` reports, cheap enough to
bump on every request. Each amount is also handed to the connector's
Prometheus series (metrics.py), so health() and /metrics read the same
numbers."""

import threading

from .metrics import NO_METRICS, ConnectorMetrics, NoMetrics


class Counters:
    FIELDS = (
        "gets",
        "get_blocks",
        "get_hits",
        "get_errors",
        "get_timeouts",
        "puts",
        "put_blocks",
        "put_failures",
        "exists",
        "exists_calls",
        # exists keys whose mexist failed, asked again: answered, or failed again
        "exists_recovered",
        "exists_failed_again",
        "deletes",
        "retries",
        "timeouts",
        "fast_fails",
        "invalid",
        # put keys refused with GDR_TRANSFER_ERROR and re-sent unregistered
        "gdr_resends",
        # write-behind: blocks accepted early, puts that waited (past the byte
        # bound), flush rounds, accepted blocks lost, blocks read from pending
        "write_behind_blocks",
        "write_behind_waits",
        "write_behind_flushes",
        "write_behind_lost",
        "write_behind_served",
        # batched L1 ingestion (aibrix_compat/ingestion.py): L2Cache.put calls,
        # blocks handed over, blocks of them not stored
        "ingestion_puts",
        "ingestion_blocks",
        "ingestion_lost",
    )

    def __init__(self, metrics: "ConnectorMetrics | NoMetrics" = NO_METRICS) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)
        self.metrics = metrics

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount
        self.metrics.counted(amounts)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
