"""`aibrix-eic bench --shared-dir DIR`: the bench's store in DIR, removed
afterwards unless --keep. Only what this run created goes: DIR if it did
not exist, else the store's own folder in it if that did not exist; a store
that was there before (another run's, kept) stays."""

import os
import shutil
from dataclasses import dataclass, field

from ..engine.shared_files import DEFAULT_MODE, check_parent, store_path
from ..util.units import format_size


def _tree_nbytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512  # what it takes on disk (sparse maps)
            except OSError:
                pass
    return total


@dataclass
class BenchStore:
    """The store folder `name` under `directory`, and what this run created."""

    directory: str
    name: str
    keep: bool = False
    created: list[str] = field(default_factory=list)  # outermost first
    removed_nbytes: int | None = None  # set once removed

    @property
    def path(self) -> str:
        return store_path(self.directory, self.name)

    def prepare(self) -> None:
        """Create DIR if it is missing (the engine creates the store's folder)."""
        directory = os.path.abspath(self.directory)
        if not os.path.exists(directory):
            check_parent(directory, create=True, mode=DEFAULT_MODE)  # 0700, as the engine's create=1 makes it
            self.created.append(directory)
        if not os.path.exists(self.path):
            self.created.append(self.path)

    def cleanup(self) -> None:
        """Remove what prepare() found missing, innermost first, unless keep.
        A DIR something else wrote into meanwhile stays."""
        if self.keep or not self.created:
            return
        nbytes = _tree_nbytes(self.path) if os.path.isdir(self.path) else 0
        for path in reversed(self.created):
            if path == self.path:
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.rmdir(path)
                except OSError:
                    pass  # not empty: not all ours
        self.removed_nbytes = nbytes

    def outcome(self) -> str:
        """One line for the report."""
        if self.removed_nbytes is not None:
            return f"removed {self.path} ({format_size(self.removed_nbytes)}); --keep keeps it"
        if self.keep:
            return f"kept {self.path} (--keep)"
        return f"left {self.path} as it was: it existed before this run"
