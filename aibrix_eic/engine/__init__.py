"""An in-process EIC engine with the SDK's Python surface.

`import aibrix_eic.engine as eic`, or `sys.modules["eic"] = aibrix_eic.engine`,
gives callers of the vendor SDK a real local store: capacity with LRU
eviction, TTL, namespaces, memory registration checks and fault injection.
See docs/engine.md.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .endpoint import ENDPOINT_PARAMS, parse_endpoint
    from .enums import LogLevel, MemoryType, StatusCode, TransportType
    from .faults import Faults
    from .registry import get_store, open_store, reset_stores
    from .store import Store, StoreStats
    from .surface import (
        Client,
        DelOption,
        ExistOption,
        GetOption,
        InitOption,
        IOBuffers,
        MemoryInfo,
        Outcome,
        SetOption,
        StringVector,
    )

# Each name and the module that defines it, imported on first use (PEP 562):
# the config check parses local:// URLs through .endpoint and must not pull
# in numpy with the stores.
_WHERE = {
    "ENDPOINT_PARAMS": "endpoint",
    "parse_endpoint": "endpoint",
    "LogLevel": "enums",
    "MemoryType": "enums",
    "StatusCode": "enums",
    "TransportType": "enums",
    "Faults": "faults",
    "get_store": "registry",
    "open_store": "registry",
    "reset_stores": "registry",
    "Store": "store",
    "StoreStats": "store",
    **dict.fromkeys(
        (
            "Client",
            "DelOption",
            "ExistOption",
            "GetOption",
            "InitOption",
            "IOBuffers",
            "MemoryInfo",
            "Outcome",
            "SetOption",
            "StringVector",
        ),
        "surface",
    ),
}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "Client",
    "DelOption",
    "ENDPOINT_PARAMS",
    "ExistOption",
    "Faults",
    "GetOption",
    "InitOption",
    "IOBuffers",
    "LogLevel",
    "MemoryInfo",
    "MemoryType",
    "Outcome",
    "SetOption",
    "StatusCode",
    "Store",
    "StoreStats",
    "StringVector",
    "TransportType",
    "get_store",
    "open_store",
    "parse_endpoint",
    "reset_stores",
]
