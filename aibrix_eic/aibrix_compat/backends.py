"""Which of AIBrix's cache managers have one of our connectors as their L2
backend. The workarounds in this package change a manager's behaviour only
then: every other manager in the process stays stock AIBrix."""

import weakref
from typing import Any


def backend_of(manager: object, ours: "weakref.WeakSet[Any]") -> object | None:
    """The manager's L2 backend if it is in `ours` (directly, or as a member
    of AIBrix's cluster placement), else None."""
    if manager is None:
        return None
    backend = getattr(getattr(manager, "_l2_cache", None), "_backend", None)
    if backend is None:
        return None
    if backend in ours:
        return backend
    members = getattr(backend, "members", None) or ()
    return next((m.conn for m in members if getattr(m, "conn", None) in ours), None)
