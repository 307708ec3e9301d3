"""A one-line progress bar for the terminal (stderr), silent when piped."""

import time
from typing import TextIO


class ProgressBar:
    """`[#######-------] 7/14 warm-up 2/2  1.93 GB/s` redrawn in place."""

    def __init__(self, total: int, stream: TextIO, enabled: bool | None = None, width: int = 28) -> None:
        self.total = max(total, 1)
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.width = width
        self.started = time.perf_counter()
        self._drawn = False

    def update(self, done: int, note: str = "") -> None:
        if not self.enabled:
            return
        filled = int(self.width * min(done, self.total) / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.perf_counter() - self.started
        line = f"\r[{bar}] {done}/{self.total} {elapsed:5.1f}s {note}"
        self.stream.write(line.ljust(79))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False
