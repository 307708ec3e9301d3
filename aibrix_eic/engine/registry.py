"""Named stores shared by every Client in the process, and endpoint parsing.

`Client.init(instance_id, endpoint, option)` binds a client to the store
named by the endpoint, creating it on first use, the way clients of one EIC
cluster share its data. An endpoint is `[name][?param=value&...]`:

    ""                               the store "default"
    "?capacity=1GiB&latency=1ms"     "default", resized, with 1 ms per call
    "bench?fail_rate=0.1"            the store "bench"
    "10.0.0.1:12500"                 a store named after an eic:// address,
                                     for callers that use the engine as `eic`
    "kv?dir=/dev/shm/aibrix-eic"     "kv" kept in that directory, shared by
                                     every process that names it (shared_store.py);
                                     DIR must exist unless `create=1` is given,
                                     `mode=0770` shares the store with a group, and
                                     `lock_timeout=500ms` bounds every wait for
                                     another process's lock (opening included)
    "?prefault=4GiB"                 "default", keeping up to 4 GiB of pages faulted
                                     ahead of its writes (`prefault=0`: none)

Parameters given on a later init re-apply to the existing store; parameters
left out keep their current value. docs/engine.md lists them; endpoint.py
parses them.
"""

import sys
import threading
from typing import TYPE_CHECKING, Any

from .endpoint import parse_endpoint
from .store import Store
from .store_api import StoreApi

if TYPE_CHECKING:
    from .shared_store import SharedStore

_SHARED_ONLY = ("create", "mode")  # how a shared store is opened; nothing to apply later
_NEEDS_DIR = (*_SHARED_ONLY, "lock_timeout")
_IN_PROCESS_ONLY = ("prefault",)  # the shared store's pages are LMDB's file pages
_stores: dict[str, Store] = {}
_stores_lock = threading.Lock()


def apply_params(store: StoreApi, params: dict[str, Any]) -> None:
    if "capacity" in params:
        store.set_capacity(params["capacity"])
    if "prefault" in params:
        store.set_prefault(params["prefault"])  # type: ignore[attr-defined]  # in-process only (open_store)
    if "max_value" in params:
        store.max_value_bytes = params["max_value"]
    if "namespaces" in params:
        store.namespaces = frozenset(params["namespaces"])
    if "mexist_miss" in params:
        store.mexist_miss = params["mexist_miss"]
    faults = store.faults
    if "latency" in params:
        faults.latency_s = params["latency"]
    if "fail_rate" in params:
        faults.fail_rate = params["fail_rate"]
    if "key_fail_rate" in params:
        faults.key_fail_rate = params["key_fail_rate"]
    if "unreachable" in params:
        faults.unreachable = params["unreachable"]
    if "phantom_rate" in params:
        faults.phantom_rate = params["phantom_rate"]
    if "gdr_write_fail_rate" in params:
        faults.gdr_write_fail_rate = params["gdr_write_fail_rate"]
    if "default_codes_fail_rate" in params:
        faults.default_codes_fail_rate = params["default_codes_fail_rate"]
    if "seed" in params:
        faults.reseed(params["seed"])
    if "lock_timeout" in params:
        store.lock_timeout_s = params["lock_timeout"]  # type: ignore[attr-defined]  # shared stores only


def open_store(endpoint: str) -> StoreApi:
    """The store an endpoint names, created on first use, params applied.

    Raises ValueError for an endpoint it cannot parse and
    errors.StoreUnavailable for a shared store it cannot open."""
    name, params = parse_endpoint(endpoint)
    store: StoreApi
    if "dir" in params:
        if any(key in params for key in _IN_PROCESS_ONLY):
            raise ValueError(
                f"engine parameter {' and '.join(_IN_PROCESS_ONLY)} applies only to a store in this process (no dir=)"
            )
        from .shared_store import open_shared_store  # imports lmdb only when used

        opening = {key: params[key] for key in _SHARED_ONLY if key in params}
        if "lock_timeout" in params:
            opening["lock_timeout_s"] = params["lock_timeout"]
        store = open_shared_store(name, params["dir"], params.get("capacity"), **opening)
    elif any(key in params for key in _NEEDS_DIR):
        raise ValueError(f"engine parameters {', '.join(_NEEDS_DIR)} apply only to a shared store (dir=DIR)")
    else:
        with _stores_lock:
            if name not in _stores:
                # Made with its capacity and prefault, so that its refiller
                # never starts mapping for the default ones.
                made = {key: params[key] for key in ("capacity", "prefault") if key in params}
                _stores[name] = Store(name=name, **made)
            store = _stores[name]
    apply_params(store, params)
    return store


def get_store(name: str = "default") -> "Store | SharedStore":
    """The store called `name` (or `name?dir=DIR` for a shared one), created
    with defaults if needed."""
    return open_store(name)  # type: ignore[return-value]


def reset_stores() -> None:
    """Forget every store (tests use this between cases). Shared stores are
    only forgotten: their data belongs to their directory."""
    with _stores_lock:
        for store in _stores.values():
            store.close()
        _stores.clear()
    shared = sys.modules.get(__package__ + ".shared_store")
    if shared is not None:
        shared.forget_shared_stores()
