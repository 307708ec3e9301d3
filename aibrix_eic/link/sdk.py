"""The seam between the connector and an EIC SDK module.

remote_url picks the module: `eic://` imports the vendor SDK (`import eic`),
`local://` uses aibrix_eic.engine. Both are driven by the same code below, and
nothing outside this file touches SDK names or unpacks SDK replies. Replies
come back as CallResult: one HIT/MISS/FAIL per key plus whether the call as a
whole failed, which is what the connector's retry and breaker logic need.
"""

import dataclasses
import enum
import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl

from ..config import ConfigError, EICConfig
from ..observability.metrics import StoreUsage
from ..util.vendor_sdk import SDK_MODULE, SDK_WHEEL_URL


class Outcome(enum.IntEnum):
    """What one key of an SDK call came to. FAIL may pass on a retry
    (transport, timeout, busy); REJECTED will not (bad buffer, too large, no
    room, unknown namespace)."""

    HIT = 0
    MISS = 1
    FAIL = 2
    REJECTED = 3


HIT, MISS, FAIL, REJECTED = Outcome.HIT, Outcome.MISS, Outcome.FAIL, Outcome.REJECTED

# One buffer of an SDK call: (address, length, registered), as IOBuffers takes it.
SdkBuffer = tuple[int, int, bool]

# Codes that mean "this request can never succeed as sent". The vendor SDK's
# names for such codes are unknown, so only the engine's are listed; any code
# missing from a module's StatusCode is simply not looked up.
_REJECTING_CODE_NAMES = (
    "VALUE_TOO_LARGE",
    "BUFFER_SIZE_MISMATCH",
    "MEMORY_NOT_REGISTERED",
    "OUT_OF_CAPACITY",
    "NAMESPACE_NOT_FOUND",
    "INVALID_ARGUMENT",
    # A shared store's write whose lock another process held past the call's
    # deadline: reads still work, so it is no sign the store is down, and a
    # retry at once would meet the same lock.
    "STORE_BUSY",
)


def load_sdk_module(config: EICConfig) -> ModuleType:
    """The module behind config.remote_url; ConfigError if it is missing."""
    if config.uses_embedded_engine:
        from .. import engine

        return engine
    try:
        return importlib.import_module(SDK_MODULE)
    except ImportError as e:
        raise ConfigError(
            config.source,
            "remote_url",
            f"{config.remote_url} needs the EIC Python SDK (`import eic` failed: {e}). "
            f"Install it with `pip install {SDK_WHEEL_URL}`, "
            "or use `remote_url: local://` for the embedded engine",
        ) from None


def init_endpoint(config: EICConfig) -> str:
    """The endpoint Client.init gets. The embedded engine's shared store
    (dir=) cannot learn a call's deadline through the SDK's call shapes, so
    it is told once: no wait for another process's lock outlasts the
    shortest of the connector's per-call timeouts, and the pool thread is
    back before the request gives up on it. A lock_timeout= the URL gives wins."""
    endpoint = config.endpoint
    if not config.uses_embedded_engine:
        return endpoint
    given = {key for key, _ in parse_qsl(endpoint.partition("?")[2], keep_blank_values=True)}
    if "dir" not in given or "lock_timeout" in given:
        return endpoint
    shortest = min(config.get_timeout_ms, config.put_timeout_ms, config.exists_timeout_ms, config.delete_timeout_ms)
    return f"{endpoint}&lock_timeout={shortest:g}ms"


@dataclass(frozen=True)
class CallResult:
    outcomes: list[Outcome]  # one per key, in order
    whole_call_failed: bool  # every key FAIL: a sign the service is down
    detail: str  # what the SDK said, for logs and error messages
    # mset keys refused with GDR_TRANSFER_ERROR: their registered transfer
    # failed, and the same bytes sent unregistered may pass (link/calls.py)
    gdr_refused: tuple[int, ...] = ()


class SdkClient:
    """One initialised `eic.Client` and the options every call reuses."""

    def __init__(self, module: ModuleType, client: Any, config: EICConfig) -> None:
        self._eic = module
        self._client = client
        self._success = module.StatusCode.SUCCESS
        self._partial_failed = module.StatusCode.PARTIAL_FAILED
        self._key_not_exist = module.StatusCode.KEY_NOT_EXIST
        self._gdr_transfer_error = getattr(module.StatusCode, "GDR_TRANSFER_ERROR", None)
        self._rejecting = frozenset(
            getattr(module.StatusCode, name) for name in _REJECTING_CODE_NAMES if hasattr(module.StatusCode, name)
        )
        self._set_option = module.SetOption()
        self._set_option.ns = config.eic_kv_ns
        self._set_option.ttl_second = config.eic_kv_ttl
        self._get_option = module.GetOption()
        self._get_option.ns = config.eic_kv_ns
        self._exist_option = module.ExistOption()
        self._exist_option.ns = config.eic_kv_ns
        self._del_option = module.DelOption()
        self._del_option.ns = config.eic_kv_ns
        # Only the embedded engine reports its fill; a vendor client's
        # attribute of that name, if one ever had it, could mean anything.
        self._reports_usage = module.__name__ == "aibrix_eic.engine"

    @classmethod
    def connect(cls, module: ModuleType, config: EICConfig) -> "tuple[SdkClient | None, str]":
        """A new client, initialised; or None and a message saying why not.

        Raises ConfigError when eic_log_dir cannot be created, which no retry
        will fix; init failures (an unreachable cluster, an SDK that raises
        while the client is set up) are returned.
        """
        if config.eic_log_dir:
            try:
                os.makedirs(config.eic_log_dir, exist_ok=True)
            except OSError as e:
                raise ConfigError(
                    config.source, "eic_log_dir", f"{config.eic_log_dir} cannot be created: {e.strerror}"
                ) from None
        try:  # a binding may refuse any field; that is a failed open, like an unreachable cluster
            option = module.InitOption()
            # The binding casts any int to its enums; the config only lets
            # the documented values through (config/schema.py).
            option.log_level = module.LogLevel(config.eic_log_level)
            option.transport_type = module.TransportType(config.eic_trans_type)
            # Unset fields keep the binding's default: a std::string field refuses None.
            if config.eic_log_dir is not None:
                option.log_dir = config.eic_log_dir
            if config.eic_flag_file is not None:
                option.flag_file = config.eic_flag_file
            client = module.Client()
            ret = client.init(config.eic_instance_id, init_endpoint(config), option)
            sdk_client = cls(module, client, config)
        except Exception as e:  # a vendor binding may raise anything
            return None, f"eic client setup raised {e!r}"
        if ret != 0:
            # The engine says why (a shared store's path, cause and fix); the SDK writes it to its logs.
            why = getattr(client, "last_error", "")
            if isinstance(why, str) and why:
                return None, f"init returned {ret}: {why}"
            where = "the embedded engine" if config.uses_embedded_engine else f"the EIC cluster at {config.remote_url}"
            reason = " (unreachable)" if ret == -1 else ""
            return None, f"init returned {ret}: {where} did not accept the client{reason}"
        return sdk_client, ""

    # ------------------------------------------------------------- calls
    def _interpret(self, op: str, status: Any, outcome: Any, nkeys: int) -> CallResult:
        codes = list(getattr(outcome, "status_codes", None) or [])
        if len(codes) != nkeys:
            # Without one code per key nothing can be confirmed, so nothing
            # counts as stored or loaded.
            return CallResult([FAIL] * nkeys, True, f"{op} {status} with {len(codes)} codes for {nkeys} keys")
        success, key_not_exist, rejecting = self._success, self._key_not_exist, self._rejecting
        # A SUCCESS code counts only under SUCCESS, or under a PARTIAL_FAILED
        # that names its failures. Any other status read and stored nothing
        # whatever its codes say (they may be left at their default), and a
        # PARTIAL_FAILED whose codes all say SUCCESS does not say which keys
        # failed: there, no key is confirmed. Misses and rejections stay as
        # coded: they claim nothing was read or stored.
        trusted = status == success or (status == self._partial_failed and any(c != success for c in codes))
        hit = HIT if trusted else FAIL
        outcomes = [
            hit if code == success else MISS if code == key_not_exist else REJECTED if code in rejecting else FAIL
            for code in codes
        ]
        whole_call_failed = status != success and outcomes.count(FAIL) == nkeys
        if status == success:
            detail = f"{op} {status}"
        else:
            detail = f"{op} {status} " + _code_summary(codes)
        return CallResult(outcomes, whole_call_failed, detail)

    def _keys(self, keys: Sequence[str]) -> Any:
        vector = self._eic.StringVector()
        vector.extend(keys)
        return vector

    def _buffers(self, buffers: Sequence[SdkBuffer]) -> Any:
        iobufs = self._eic.IOBuffers()
        for addr, length, registered in buffers:
            iobufs.append(addr, length, registered)
        return iobufs

    def mset(self, keys: Sequence[str], buffers: Sequence[SdkBuffer]) -> CallResult:
        try:
            status, outcome = self._client.mset(self._keys(keys), self._buffers(buffers), self._set_option)
        except Exception as e:
            return CallResult([FAIL] * len(keys), True, f"mset raised {e!r}")
        return self._with_gdr_refusals(self._interpret("mset", status, outcome, len(keys)), outcome)

    def _with_gdr_refusals(self, result: CallResult, outcome: Any) -> CallResult:
        """Note the keys refused with GDR_TRANSFER_ERROR. A reply naming that
        code answered per key, so it is no sign that EIC is down."""
        if FAIL not in result.outcomes or self._gdr_transfer_error is None:
            return result
        codes = list(getattr(outcome, "status_codes", None) or [])
        if len(codes) != len(result.outcomes):
            return result
        refused = tuple(
            i for i, code in enumerate(codes) if code == self._gdr_transfer_error and result.outcomes[i] == FAIL
        )
        if not refused:
            return result
        return dataclasses.replace(result, whole_call_failed=False, gdr_refused=refused)

    def mget(self, keys: Sequence[str], buffers: Sequence[SdkBuffer]) -> CallResult:
        try:
            status, _, outcome = self._client.mget(self._keys(keys), self._get_option, self._buffers(buffers))
        except Exception as e:
            return CallResult([FAIL] * len(keys), True, f"mget raised {e!r}")
        return self._interpret("mget", status, outcome, len(keys))

    def mexist(self, keys: Sequence[str], keep_failures: bool = False) -> CallResult:
        try:
            status, outcome = self._client.mexist(self._keys(keys), self._exist_option)
        except Exception as e:
            return CallResult([FAIL] * len(keys), True, f"mexist raised {e!r}")
        result = self._interpret("mexist", status, outcome, len(keys))
        if result.whole_call_failed:
            return result
        # Any non-SUCCESS per-key code of mexist is a miss, but for a key that
        # failed (a TIMEOUT, not KEY_NOT_EXIST) with `keep_failures`: the
        # exists batcher asks such a key again before it counts as a miss.
        failed = FAIL if keep_failures else MISS
        outcomes = [HIT if o == HIT else failed if o == FAIL else MISS for o in result.outcomes]
        return CallResult(outcomes, False, result.detail)

    def mdel(self, keys: Sequence[str]) -> CallResult:
        try:
            status, outcome = self._client.mdel(self._keys(keys), self._del_option)
        except Exception as e:
            return CallResult([FAIL] * len(keys), True, f"mdel raised {e!r}")
        return self._interpret("mdel", status, outcome, len(keys))

    def store_usage(self) -> StoreUsage | None:
        """The store's bytes used, capacity and evictions, where the module
        reports them (the embedded engine); None for the vendor SDK."""
        client = self._client  # looked up per call: close() lets go of the client
        if not self._reports_usage or client is None:
            return None
        reading = client.store_usage()
        return None if reading is None else StoreUsage(*reading)

    def close(self) -> None:
        """Let go of the client. The SDK documents no close; a version that
        has one of these names gets it called. Later calls fail as FAIL."""
        client, self._client = self._client, None
        for name in ("close", "destroy", "uninit"):
            method = getattr(client, name, None)
            if callable(method):
                try:
                    method()
                except Exception:
                    pass
                return

    def register(self, regions: Sequence[tuple[int, int]], cuda_device: int | None) -> tuple[bool, str]:
        """register_memory for (addr, nbytes) regions; (ok, message)."""
        iobufs = self._eic.IOBuffers()
        for addr, nbytes in regions:
            iobufs.append(addr, nbytes, True)
        info = self._eic.MemoryInfo()
        if cuda_device is None:
            info.type = self._eic.MemoryType.MEMORY_DEFAULT
        else:
            info.type = self._eic.MemoryType.MEMORY_CUDA
            info.cuda_id = cuda_device
        try:
            ok = bool(self._client.register_memory(iobufs, info))
        except Exception as e:
            return False, f"register_memory raised {e!r}"
        total = sum(nbytes for _, nbytes in regions)
        return ok, "" if ok else f"register_memory returned False for {len(regions)} regions ({total} bytes)"


def _code_summary(codes: Sequence[Any]) -> str:
    counts: dict[str, int] = {}
    for code in codes:
        name = str(code)
        counts[name] = counts.get(name, 0) + 1
    return "{" + ", ".join(f"{name}: {n}" for name, n in counts.items()) + "}"
