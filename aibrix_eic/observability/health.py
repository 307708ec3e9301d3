"""The EIC connectors alive in this process, so `aibrix_eic.health()` can
report on them without AIBrix's private attributes
(`manager._l2_cache._backend`). Weak references: a connector AIBrix dropped
is not kept alive by being listed here."""

import threading
import weakref
from typing import Any

_connectors: "weakref.WeakSet[Any]" = weakref.WeakSet()
_lock = threading.Lock()


def add(connector: Any) -> None:
    with _lock:
        _connectors.add(connector)


def health() -> list[dict[str, Any]]:
    """health() of every live connector, in no particular order."""
    with _lock:
        connectors = list(_connectors)
    return [connector.health() for connector in connectors]
