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
left out keep their current value. docs/engine.md lists them.
"""

import difflib
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from ..util.flags import parse_flag
from ..util.units import exact_size_text, parse_duration, parse_size
from .shared_files import parse_mode
from .store import MEXIST_MISS_READINGS, Store
from .store_api import StoreApi
from .store_pages import parse_prefault

if TYPE_CHECKING:
    from .shared_store import SharedStore

# Upper bounds of the numeric parameters: far above any test or benchmark,
# low enough that no value overflows a sleep or an allocation size.
MAX_CAPACITY = 1024**5  # 1 PiB
MAX_VALUE = 4 * 1024**3
MAX_LATENCY_S = 3600.0


def _parse_rate(text: str) -> float:
    rate = float(text)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"expected a rate between 0 and 1, got {text!r}")
    return rate


def _bounded_size(maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        nbytes = parse_size(text)
        if nbytes > maximum:
            raise ValueError(f"expected at most {exact_size_text(maximum)}, got {text!r}")
        return nbytes

    return parse


def _parse_latency(text: str) -> float:
    seconds = parse_duration(text)
    if seconds > MAX_LATENCY_S:
        raise ValueError(f"expected at most {MAX_LATENCY_S:g}s, got {text!r}")
    return seconds


def _parse_lock_timeout(text: str) -> float:
    seconds = _parse_latency(text)
    if seconds <= 0:
        raise ValueError(f"expected a duration above 0, got {text!r}")
    return seconds


def _parse_namespaces(text: str) -> list[str]:
    return [ns for ns in text.split(",")]


def _parse_mexist_miss(text: str) -> str:
    if text not in MEXIST_MISS_READINGS:
        raise ValueError(f"expected one of {', '.join(MEXIST_MISS_READINGS)}, got {text!r}")
    return text


def _parse_seed(text: str) -> int:
    return int(text)


def _parse_dir(text: str) -> str:
    if not text.strip():
        raise ValueError("expected a directory path, got an empty one")
    return text


# param name -> (parser, where it applies)
ENDPOINT_PARAMS: dict[str, Callable[[str], Any]] = {
    "capacity": _bounded_size(MAX_CAPACITY),
    "max_value": _bounded_size(MAX_VALUE),
    "namespaces": _parse_namespaces,
    "latency": _parse_latency,
    "fail_rate": _parse_rate,
    "key_fail_rate": _parse_rate,
    "unreachable": parse_flag,
    "phantom_rate": _parse_rate,
    "gdr_write_fail_rate": _parse_rate,
    "mexist_miss": _parse_mexist_miss,
    "default_codes_fail_rate": _parse_rate,
    "seed": _parse_seed,
    "dir": _parse_dir,
    "create": parse_flag,
    "mode": parse_mode,
    "lock_timeout": _parse_lock_timeout,
    "prefault": parse_prefault,
}
_SHARED_ONLY = ("create", "mode")  # how a shared store is opened; nothing to apply later
_NEEDS_DIR = (*_SHARED_ONLY, "lock_timeout")
_IN_PROCESS_ONLY = ("prefault",)  # the shared store's pages are LMDB's file pages


def parse_endpoint(endpoint: str) -> tuple[str, dict[str, Any]]:
    """Split an endpoint into its store name and parsed parameters.

    Raises ValueError naming the parameter on anything it cannot parse.
    """
    name, _, query = (endpoint or "").partition("?")
    name = name.strip().rstrip("/") or "default"
    params: dict[str, Any] = {}
    for key, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        parser = ENDPOINT_PARAMS.get(key)
        if parser is None:
            hint = difflib.get_close_matches(key, ENDPOINT_PARAMS, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ValueError(f"unknown engine parameter {key!r}{suggestion} (known: {', '.join(ENDPOINT_PARAMS)})")
        try:
            params[key] = parser(raw)
        except ValueError as e:
            raise ValueError(f"engine parameter {key}={raw!r}: {e}") from None
    return name, params


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
