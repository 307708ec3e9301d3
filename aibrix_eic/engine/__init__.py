"""An in-process EIC engine with the SDK's Python surface.

`import aibrix_eic.engine as eic`, or `sys.modules["eic"] = aibrix_eic.engine`,
gives callers of the vendor SDK a real local store: capacity with LRU
eviction, TTL, namespaces, memory registration checks and fault injection.
See docs/engine.md.
"""

from .enums import LogLevel, MemoryType, StatusCode, TransportType
from .faults import Faults
from .registry import ENDPOINT_PARAMS, get_store, open_store, parse_endpoint, reset_stores
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
