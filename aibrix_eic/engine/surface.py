"""The names public callers import from the `eic` SDK, backed by a Store.

Call shapes follow the SDK's public callers, AIBrix's connector
(https://github.com/vllm-project/aibrix/blob/main/python/aibrix_kvcache/aibrix_kvcache/l2/connectors/eic/eic.py)
and SGLang's EIC storage backend
(https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/mem_cache/storage/eic/eic_storage.py):

    status, outcome = client.mset(keys, vals, set_option)
    status, vals, outcome = client.mget(keys, get_option, vals)
    status, outcome = client.mexist(keys, exist_option)
    status, outcome = client.mdel(keys[, del_option])

`outcome.status_codes` holds one code per key, in order, on every reply,
failures included. Where the SDK's behaviour is unknown this engine takes the
strict reading; docs/engine.md lists each choice.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from ..engine import device
from ..util import address_ranges as intervals
from ..util.rate_limited_log import RateLimitedLogger
from . import open_errors
from .enums import LogLevel, MemoryType, StatusCode, TransportType, overall_status
from .errors import StoreUnavailable
from .registry import open_store
from .shared_lock import LockTimeout
from .store_api import StoreApi
from .typed import Field, Struct


class StringVector(list[str]):
    """A list of str keys (pybind11 `std::vector<std::string>` stand-in)."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        super().__init__()
        self.extend(keys)

    def append(self, key: str) -> None:
        if not isinstance(key, str):
            raise TypeError(f"StringVector holds str keys, got {type(key).__name__}")
        super().append(key)

    def extend(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if not all(type(key) is str for key in keys):
            for key in keys:
                self.append(key)  # raises on the first non-str
        super().extend(keys)


class IOBuffers:
    """(address, length, registered) triples naming caller memory."""

    __slots__ = ("_buffers",)

    def __init__(self) -> None:
        self._buffers: list[tuple[int, int, bool]] = []

    def append(self, addr: int, length: int, registered: bool = False) -> None:
        if not isinstance(addr, int) or not isinstance(length, int):
            raise TypeError("IOBuffers.append(addr: int, length: int, registered: bool)")
        self._buffers.append((addr, length, bool(registered)))

    def __len__(self) -> int:
        return len(self._buffers)

    def __getitem__(self, index: int) -> tuple[int, int, bool]:
        return self._buffers[index]

    def __iter__(self) -> Iterator[tuple[int, int, bool]]:
        return iter(self._buffers)


class InitOption(Struct):
    log_dir = Field(str, "")
    log_level = Field(LogLevel, LogLevel.INFO)
    transport_type = Field(TransportType, TransportType.TRANSPORT_GDR)
    flag_file = Field(str, "")
    multi_net_local_interface_names = Field(str, "")


class MemoryInfo(Struct):
    type = Field(MemoryType, MemoryType.MEMORY_DEFAULT)
    cuda_id = Field(int, 0)


class GetOption(Struct):
    ns = Field(str, "")


class ExistOption(Struct):
    ns = Field(str, "")


class DelOption(Struct):
    ns = Field(str, "")


class SetOption(Struct):
    ns = Field(str, "")
    ttl_second = Field(int, -1)


class Outcome:
    __slots__ = ("status_codes",)

    def __init__(self, status_codes: list[StatusCode]) -> None:
        self.status_codes = status_codes

    def __repr__(self) -> str:
        return f"Outcome(status_codes={[str(c) for c in self.status_codes]})"


# A bound vector type takes no plain list in its place: the binding refuses
# arguments it cannot convert with TypeError before anything runs.
def _require_keys(call: str, keys: object) -> None:
    if not isinstance(keys, StringVector):
        raise TypeError(
            f"{call}(): incompatible function arguments: keys must be a StringVector, got {type(keys).__name__}"
        )


def _require_buffers(call: str, buffers: object) -> None:
    if not isinstance(buffers, IOBuffers):
        raise TypeError(f"{call}(): incompatible function arguments: expected IOBuffers, got {type(buffers).__name__}")


def _require_init_arguments(instance_id: object, endpoint: object, option: object) -> None:
    # std::string parameters refuse None as the option's string fields do, and
    # a `const InitOption&` takes no None either.
    if type(instance_id) is not str or type(endpoint) is not str or not isinstance(option, InitOption):
        given = ", ".join(type(arg).__name__ for arg in (instance_id, endpoint, option))
        raise TypeError(
            "init(): incompatible function arguments: expected (instance_id: str, endpoint: str, "
            f"option: InitOption), got ({given})"
        )


def _failed(nkeys: int, code: StatusCode = StatusCode.FAILED) -> tuple[StatusCode, Outcome]:
    return StatusCode.FAILED, Outcome([code] * nkeys)


T = TypeVar("T")
_rate_log = RateLimitedLogger(logging.getLogger(__name__))


def _answered(nkeys: int, call: Callable[[], T], writes: bool = False) -> T | list[StatusCode]:
    """A shared store's call, or one code per key where it could not run,
    logged at most once per 10 s per kind. A lock not free by the call's
    deadline (another process busy or frozen): TIMEOUT for a read, which
    the store could not serve; STORE_BUSY for a write, while reads may go
    on (a frozen reader holds up writers only), so a caller need not take
    the store for down. Any other failure (a replaced lock file, out of
    descriptors): FAILED."""
    try:
        return call()
    except LockTimeout as e:
        _rate_log.log("lock-timeout", logging.WARNING, "%s", e)
        return [StatusCode.STORE_BUSY if writes else StatusCode.TIMEOUT] * nkeys
    except StoreUnavailable as e:
        _rate_log.log(type(e).__name__, logging.WARNING, "%s", e)
        return [StatusCode.FAILED] * nkeys


class Client:
    """An EIC client bound to one named Store after `init`."""

    def __init__(self) -> None:
        self._store: StoreApi | None = None
        self._instance_id: str | None = None
        self._registered: intervals.Index = intervals.EMPTY
        self._device: intervals.Index = intervals.EMPTY  # the registered regions that are device memory
        self._registration_lock = threading.Lock()
        # Why the last init failed (engine only: the SDK writes it to its log
        # files); the connector adds it to its own message.
        self.last_error = ""

    # ------------------------------------------------------------ lifecycle
    def init(self, instance_id: str, endpoint: str, option: InitOption) -> int:
        """Bind to the store named by `endpoint`. 0 on success.

        Never raises for a store it cannot open: returns -1 when the store
        is marked unreachable or cannot be opened (a real cluster that
        cannot be reached does the same) and -22 for an endpoint it cannot
        parse; `last_error` and the log (once per message) say why, with
        the store's path and the fix. Arguments the binding itself would
        refuse raise TypeError before anything runs, as they do there.
        """
        _require_init_arguments(instance_id, endpoint, option)
        self.last_error = ""
        try:
            store = open_store(endpoint)
        except ValueError as e:  # the endpoint's text: nothing was opened
            self.last_error = f"bad endpoint {endpoint!r}: {e}"
            open_errors.report(self.last_error)
            return open_errors.INVALID
        except Exception as e:
            problem = open_errors.explain(endpoint, e)
            if problem is None:
                self.last_error = f"opening {endpoint!r} failed internally: {e!r}; this is a bug in aibrix-eic"
                open_errors.report(self.last_error, exc_info=e)
            else:
                self.last_error = str(problem)
                open_errors.report(problem)
            return open_errors.UNAVAILABLE
        if store.faults.unreachable:  # a model of the SDK's cluster: says no more than it would
            return open_errors.UNAVAILABLE
        self._store = store
        self._instance_id = instance_id
        return 0

    def register_memory(self, buffers: IOBuffers, info: MemoryInfo | None = None) -> bool:
        """Register caller memory; buffers appended later with
        registered=True must lie inside a region registered here."""
        _require_buffers("register_memory", buffers)
        if self._store is None or len(buffers) == 0:
            return False
        regions = []
        for addr, length, _ in buffers:
            if addr <= 0 or length <= 0:
                return False
            regions.append((addr, addr + length))
        on_device = []
        if info is not None and info.type == MemoryType.MEMORY_CUDA:
            on_device = [(start, end) for start, end in regions if device.is_device_memory(start, end - start)]
        with self._registration_lock:
            self._registered = intervals.merge(intervals.ranges(self._registered) + regions)
            if on_device:
                self._device = intervals.merge(intervals.ranges(self._device) + on_device)
        return True

    def _is_registered(self, addr: int, length: int) -> bool:
        return intervals.covers(self._registered, addr, length)

    def _on_device(self, buffers: list[tuple[int, int]]) -> dict[str, list[bool]]:
        """Store.put_many/get_many's `on_device`: which buffers lie in
        registered device memory, whatever their `registered` flag says.
        Empty (the Store's host-only call) when none is registered."""
        index = self._device
        if not index[0]:
            return {}
        return {"on_device": [intervals.covers(index, addr, length) for addr, length in buffers]}

    # ------------------------------------------------------------ data path
    def _begin_call(self, keys: Sequence[str], ns: str) -> StoreApi | tuple[StatusCode, Outcome]:
        """The bound store, or the reply this call must return without it:
        empty calls succeed; an unbound client, an injected whole-call
        failure or an unknown namespace fail every key."""
        nkeys = len(keys)
        if nkeys == 0:
            return StatusCode.SUCCESS, Outcome([])
        store = self._store
        if store is None:
            return _failed(nkeys, StatusCode.NOT_INITIALIZED)
        faults = store.faults
        if faults.latency_s > 0:
            time.sleep(faults.latency_s)
        if faults.call_fails():
            return _failed(nkeys)
        if faults.call_fails_with_default_codes():
            return _failed(nkeys, StatusCode.SUCCESS)
        if not store.has_namespace(ns):
            return _failed(nkeys, StatusCode.NAMESPACE_NOT_FOUND)
        return store

    def _screen(
        self, store: StoreApi, keys: Sequence[str], vals: IOBuffers, max_value_bytes: int | None, writing: bool = False
    ) -> tuple[list[StatusCode], list[int], list[str], list[tuple[int, int]]]:
        """Per-key checks before the store is touched: bad buffers, memory not
        registered, oversize values, injected GDR and key failures. Returns
        the codes so far and the (index, key, (addr, length)) of keys that
        may proceed."""
        codes = [StatusCode.SUCCESS] * len(keys)
        faults = store.faults
        inject = faults.key_fail_rate > 0
        inject_gdr = writing and faults.gdr_write_fail_rate > 0
        is_registered = self._is_registered
        todo_index: list[int] = []
        todo_keys: list[str] = []
        todo_buffers: list[tuple[int, int]] = []
        for i, (addr, length, registered) in enumerate(vals):
            if addr <= 0 or length <= 0:
                codes[i] = StatusCode.INVALID_ARGUMENT
            elif registered and not is_registered(addr, length):
                codes[i] = StatusCode.MEMORY_NOT_REGISTERED
            elif max_value_bytes is not None and length > max_value_bytes:
                codes[i] = StatusCode.VALUE_TOO_LARGE
            elif inject_gdr and registered and faults.gdr_write_fails():
                codes[i] = StatusCode.GDR_TRANSFER_ERROR
            elif inject and faults.key_fails():
                codes[i] = StatusCode.FAILED
            else:
                todo_index.append(i)
                todo_keys.append(keys[i])
                todo_buffers.append((addr, length))
        return codes, todo_index, todo_keys, todo_buffers

    @staticmethod
    def _merge(codes: list[StatusCode], todo_index: list[int], store_codes: list[StatusCode]) -> list[StatusCode]:
        if len(todo_index) == len(codes):
            return store_codes
        for i, code in zip(todo_index, store_codes):
            codes[i] = code
        return codes

    def mset(self, keys: Sequence[str], vals: IOBuffers, option: SetOption | None = None) -> tuple[StatusCode, Outcome]:
        _require_keys("mset", keys)
        _require_buffers("mset", vals)
        option = option or SetOption()
        if len(keys) != len(vals) or option.ttl_second == 0 or option.ttl_second < -1:
            return _failed(len(keys), StatusCode.INVALID_ARGUMENT)
        store = self._begin_call(keys, option.ns)
        if isinstance(store, tuple):
            return store
        codes, todo_index, todo_keys, todo_buffers = self._screen(
            store, keys, vals, store.max_value_bytes, writing=True
        )
        if todo_index:
            stored = _answered(
                len(todo_keys),
                lambda: store.put_many(
                    option.ns, todo_keys, todo_buffers, option.ttl_second, **self._on_device(todo_buffers)
                ),
                writes=True,
            )
            codes = self._merge(codes, todo_index, stored)
        return overall_status(codes), Outcome(codes)

    def mget(
        self, keys: Sequence[str], option: GetOption | None = None, vals: IOBuffers | None = None
    ) -> tuple[StatusCode, IOBuffers | list[str], Outcome]:
        """Copy values into `vals`. With vals=None, values come back in the
        second element as a list of str, as a binding returning C++ strings
        gives them: UTF-8 decoded ("" for a key without a value); a value
        that is not UTF-8 raises UnicodeDecodeError (docs/engine.md)."""
        _require_keys("mget", keys)
        if vals is not None:
            _require_buffers("mget", vals)
        option = option or GetOption()
        if vals is not None and len(keys) != len(vals):
            status, outcome = _failed(len(keys), StatusCode.INVALID_ARGUMENT)
            return status, vals, outcome
        store = self._begin_call(keys, option.ns)
        if isinstance(store, tuple):
            return store[0], vals if vals is not None else [], store[1]
        if vals is None:
            text = _answered(len(keys), lambda: self._mget_as_text(store, keys, option.ns))
            if isinstance(text, tuple):
                return text
            return overall_status(text), [""] * len(keys), Outcome(text)
        codes, todo_index, todo_keys, todo_buffers = self._screen(store, keys, vals, None)
        if todo_index:
            fetched = _answered(
                len(todo_keys),
                lambda: store.get_many(option.ns, todo_keys, todo_buffers, **self._on_device(todo_buffers)),
            )
            codes = self._merge(codes, todo_index, fetched)
        return overall_status(codes), vals, Outcome(codes)

    def _mget_as_text(self, store: StoreApi, keys: Sequence[str], ns: str) -> tuple[StatusCode, list[str], Outcome]:
        import ctypes

        raw: list[bytes] = []
        codes: list[StatusCode] = []
        for key in keys:
            size = store.value_size(ns, key)
            if size is None:
                raw.append(b"")
                codes.append(StatusCode.KEY_NOT_EXIST)
                continue
            out = ctypes.create_string_buffer(size)
            code = store.get_many(ns, [key], [(ctypes.addressof(out), size)])[0]
            raw.append(out.raw if code == StatusCode.SUCCESS else b"")
            codes.append(code)
        # The cast of the reply, after the call: strict UTF-8, as pybind11's std::string -> str.
        return overall_status(codes), [value.decode("utf-8") for value in raw], Outcome(codes)

    def mexist(self, keys: Sequence[str], option: ExistOption | None = None) -> tuple[StatusCode, Outcome]:
        _require_keys("mexist", keys)
        option = option or ExistOption()
        store = self._begin_call(keys, option.ns)
        if isinstance(store, tuple):
            return store
        faults = store.faults
        codes = []
        found = _answered(len(keys), lambda: store.exist_many(option.ns, keys))
        if found and isinstance(found[0], StatusCode):  # the store could not answer
            return overall_status(found), Outcome(found)
        timed_out = False
        for key, present in zip(keys, found):
            if (faults.exist_flaps or faults.exist_key_fail_rate) and faults.exist_key_fails(key):
                codes.append(StatusCode.TIMEOUT)
                timed_out = True
            elif present or faults.phantom_hit():
                codes.append(StatusCode.SUCCESS)
            else:
                codes.append(StatusCode.KEY_NOT_EXIST)
        status = overall_status(codes) if timed_out or store.mexist_miss == "failed" else StatusCode.SUCCESS
        return status, Outcome(codes)

    def mdel(self, keys: Sequence[str], option: DelOption | None = None) -> tuple[StatusCode, Outcome]:
        _require_keys("mdel", keys)
        option = option or DelOption()
        store = self._begin_call(keys, option.ns)
        if isinstance(store, tuple):
            return store
        codes = _answered(len(keys), lambda: store.delete_many(option.ns, keys), writes=True)
        return overall_status(codes), Outcome(codes)

    # ---------------------------------------------------- beyond the SDK
    def store_usage(self) -> tuple[int, int, int] | None:
        """(bytes held against the capacity, the capacity, evictions this
        process made) of the bound store, or None before init. Not an SDK
        call: the connector's metrics read it where the module has it."""
        store = self._store
        if store is None:
            return None
        return store.held_bytes, store.capacity, store.stats.evictions
