"""Operation counters: what `EICConnector.health()` reports, cheap enough to
bump on every request."""

import threading


class Counters:
    FIELDS = (
        "gets", "get_blocks", "get_hits", "puts", "put_blocks", "put_failures",
        "exists", "exists_calls", "deletes", "retries", "timeouts", "fast_fails", "invalid",
    )  # fmt: skip

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)
