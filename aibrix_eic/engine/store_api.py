"""What a Client needs of a store, met by the in-process Store and by the
shared SharedStore alike."""

from collections.abc import Callable, Sequence
from typing import Protocol

from .enums import StatusCode
from .faults import Faults
from .store import StoreStats


class StoreApi(Protocol):
    name: str
    faults: Faults
    stats: StoreStats
    max_value_bytes: int
    namespaces: frozenset[str] | None
    clock: Callable[[], float]
    mexist_miss: str

    @property
    def capacity(self) -> int: ...

    @property
    def held_bytes(self) -> int: ...

    def set_capacity(self, capacity: int) -> None: ...

    def has_namespace(self, ns: str) -> bool: ...

    def value_size(self, ns: str, key: str) -> int | None: ...

    def put_many(
        self,
        ns: str,
        keys: Sequence[str],
        sources: Sequence[tuple[int, int]],
        ttl_second: int,
        on_device: Sequence[bool] | None = None,
    ) -> list[StatusCode]: ...

    def get_many(
        self,
        ns: str,
        keys: Sequence[str],
        destinations: Sequence[tuple[int, int]],
        on_device: Sequence[bool] | None = None,
    ) -> list[StatusCode]: ...

    def exist_many(self, ns: str, keys: Sequence[str]) -> list[bool]: ...

    def delete_many(self, ns: str, keys: Sequence[str]) -> list[StatusCode]: ...

    def clear(self) -> StatusCode: ...
