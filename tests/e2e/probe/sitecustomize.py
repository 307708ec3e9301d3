"""TEST SCAFFOLDING: a window into the embedded engine inside vLLM's workers.

The e2e suite puts this directory on the server's PYTHONPATH only, so Python
imports it at start in every server process (API server, engine core,
workers). With E2E_PROBE_DIR set, a daemon thread in each process that has
loaded the embedded engine (it never imports it) does, every 0.2 s
(E2E_PROBE_INTERVAL_S):

- writes `store-<pid>.json`: each engine store's stats and key count
  (for a shared store: this process's stats, the store's key count), the
  evidence that our L2 received and served blocks (the store lives in the
  worker process, so the test cannot read it directly);
- runs each `cmd-<name>.json` not yet run by this process, then writes
  `done-<name>-<pid>.json`. Commands act on the store the way a remote
  cluster's state would change under the server: {"params": "fail_rate=0.2"}
  re-applies engine endpoint parameters (docs/engine.md), {"corrupt": true}
  overwrites every stored value's bytes (in a shared store with a matching
  checksum, so reads serve the wrong bytes rather than a miss), {"clear": true} drops all values.

With E2E_PROBE_AT_START='{"store": NAME, "params": "unreachable=true"}', the
store is created with those parameters as soon as the engine is imported,
before any client connects: the endpoint's own parameters are re-applied at
every connect, so a knob set there could never be lifted by a command.

It never touches vLLM, AIBrix or the connector (it reads `aibrix_eic.health()`
when the connector is loaded, for the dump).
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("E2E_PROBE_DIR")
# benchmarks/serve.py sets a longer one: the probe's own CPU would count in the eic phases' times
_INTERVAL_S = float(os.environ.get("E2E_PROBE_INTERVAL_S", "0.2"))
_AT_START = os.environ.get("E2E_PROBE_AT_START")
_REGISTRY = "aibrix_eic.engine.registry"
_SHARED = "aibrix_eic.engine.shared_store"


def _apply_at_start(registry) -> None:
    command = json.loads(_AT_START)
    store = registry.get_store(command["store"])
    registry.apply_params(store, registry.parse_endpoint("?" + command["params"])[1])


class _AtStartFinder(importlib.abc.MetaPathFinder):
    """Runs _apply_at_start right after the engine registry is imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _REGISTRY:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _apply_at_start(module)

        spec.loader.exec_module = exec_module
        return spec


def _write(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, default=str)
    os.replace(tmp, path)


POISON = 0x3C  # every fp32 byte-filled with it is 0x3c3c3c3c (0.0115): finite, wrong


def _corrupt(store) -> int:
    if hasattr(store, "_dbs"):  # a shared store: overwrite its LMDB values in one write
        from aibrix_eic.engine.shared_records import META, value_checksum

        overwritten = []

        def poison(writer) -> None:
            values, metas = store._dbs["values"], store._dbs["meta"]
            for db_key, value in list(writer.txn.cursor(db=values)):
                poisoned = bytes([POISON]) * len(value)
                writer.txn.put(db_key, poisoned, db=values)
                # the checksum follows the value, so a read serves wrong KV instead of a miss for damage
                meta = writer.txn.get(db_key, db=metas)
                if meta is not None:
                    seq, expires_at, nbytes, _ = META.unpack_from(meta)
                    record = META.pack(seq, expires_at, nbytes, value_checksum(poisoned)) + bytes(meta[META.size :])
                    writer.txn.put(db_key, record, db=metas)
                overwritten.append(db_key)

        store._write(poison)
        return len(overwritten)
    if not hasattr(store, "_index"):
        raise TypeError(f"corrupt: only in-process and shared stores, not {type(store).__name__}")
    with store._lock:
        values = list(store._index.values())
        for value in values:
            value.buf[: value.nbytes] = POISON
    return len(values)


def _stores(registry) -> list:
    """(name, store) of every engine store this process opened: in-process
    ones and handles of shared ones (`local://NAME?dir=DIR`)."""
    stores = list(registry._stores.items())
    shared = sys.modules.get(_SHARED)
    if shared is not None:
        stores += [(store.name, store) for store in list(shared._shared.values())]
    return stores


def _run(registry, command: dict) -> dict:
    result = {}
    for name, store in _stores(registry):
        if "params" in command:
            _, params = registry.parse_endpoint("?" + command["params"])
            registry.apply_params(store, params)
            result[name] = "params applied"
        if command.get("corrupt"):
            result[name] = f"corrupted {_corrupt(store)} values"
        if command.get("clear"):
            store.clear()
            result[name] = "cleared"
    return result


def _loop() -> None:
    pid = os.getpid()
    done: set[str] = set()
    while True:
        time.sleep(_INTERVAL_S)
        registry = sys.modules.get(_REGISTRY)
        if registry is None:
            continue
        try:
            for entry in sorted(os.listdir(_DIR)):
                if entry.startswith("cmd-") and entry.endswith(".json") and entry not in done:
                    done.add(entry)
                    with open(os.path.join(_DIR, entry)) as f:
                        result = _run(registry, json.load(f))
                    _write(os.path.join(_DIR, f"done-{entry[4:-5]}-{pid}.json"), result)
            stores = {
                name: dict(vars(store.stats), keys=len(store), unreachable=store.faults.unreachable)
                for name, store in _stores(registry)
            }
            live = sys.modules.get("aibrix_eic.observability.health")
            health = sys.modules["aibrix_eic"].health() if live is not None else []
            _write(
                os.path.join(_DIR, f"store-{pid}.json"),
                {"pid": pid, "time": time.time(), "stores": stores, "health": health},
            )
        except Exception as e:  # keep probing; say why once per kind
            sys.stderr.write(f"e2e probe {pid}: {e!r}\n")


def _start() -> None:
    threading.Thread(target=_loop, name="e2e-probe", daemon=True).start()


if _AT_START:
    if _REGISTRY in sys.modules:
        _apply_at_start(sys.modules[_REGISTRY])
    else:
        sys.meta_path.insert(0, _AtStartFinder())
if _DIR:
    _start()
    os.register_at_fork(after_in_child=_start)  # a forked worker has no threads
