"""Why a store could not be opened or used, in words an operator can act on."""


class StoreUnavailable(Exception):
    """A shared store that cannot be opened or used.

    Carries the store's path, the cause and the fix, so every caller
    (`Client.init`, `aibrix-eic check`, the connector's log) can say all
    three without knowing which of many causes it was.
    """

    def __init__(self, path: str, cause: str, fix: str) -> None:
        super().__init__(path, cause, fix)
        self.path = path
        self.cause = cause
        self.fix = fix

    def __str__(self) -> str:
        return f"shared store {self.path}: {self.cause}; {self.fix}"


class StoreFull(StoreUnavailable):
    """A write the store has no room for: its filesystem is full, or its map
    is full of pages older snapshots still hold. Every call turns it into
    OUT_OF_CAPACITY codes (put, delete, clear); the store serves on."""
