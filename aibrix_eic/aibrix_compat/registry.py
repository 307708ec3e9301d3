"""Every change this package makes to aibrix-kvcache's behaviour, declared
once: what each fixes and where the upstream report is, the versions it
applies to, its one opt-out variable (`AIBRIX_EIC_<NAME>=0`), how it
installs, and the AIBrix names it relies on (surface.py checks them).
`install_all` is the only caller of the installers; `aibrix-eic check`
prints `decide`'s answer for each entry, one line each.

A version inside `versions` other than the one the suite runs on
(`TESTED`) gets each entry's `untested` choice: "install" (its needs are
checked in AIBrix's source first, and a missing one skips it) or "skip".
Outside `versions` every entry is skipped. Each says what it did once per
process in the log, at WARNING for anything but the tested version (and
for a deprecated opt-out variable).

NAMEs start with `PATCH_`, which no config key may (the per-key variables
are `AIBRIX_EIC_<KEY>`; tests/unit/test_compat_registry.py holds both to it).
"""

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ..util.docs import docs_url
from ..util.flags import parse_flag
from . import flush, ingestion, timeouts
from .surface import Need, missing

logger = logging.getLogger(__name__)

ENV_PREFIX = "AIBRIX_EIC_"
NAME_PREFIX = "PATCH_"
TESTED = "0.8.0"  # the aibrix-kvcache the test suite runs on
REQUIREMENT = (">=0.8", "<0.9")  # pyproject.toml's aibrix-kvcache pin; every entry's range below agrees
INSTALL, SKIP = "install", "skip"

Installer = Callable[[object, Any], bool]  # (connector, its Counters) -> in place


@dataclass(frozen=True)
class Alias:
    """A deprecated opt-out variable still read: `off` is the value (as a
    flag) that turns the workaround off."""

    env: str
    off: bool


@dataclass(frozen=True)
class Workaround:
    name: str  # PATCH_...: the opt-out is AIBRIX_EIC_<name>=0
    fixes: str
    report: str  # the anchor of its report in docs/aibrix-upstream-reports.md
    versions: tuple[str, str]  # (">=low", "<high"): the aibrix-kvcache releases it applies to
    untested: str  # INSTALL or SKIP on a version in range that is not TESTED
    install: Installer | None  # None: a declaration of needs only (the connector's own code uses them)
    needs: tuple[Need, ...]
    aliases: tuple[Alias, ...] = ()

    @property
    def opt_out(self) -> str:
        return ENV_PREFIX + self.name

    @property
    def report_link(self) -> str:
        # the page is literal for the docs test; the anchors: tests/unit/test_compat_registry.py
        return f"{docs_url('aibrix-upstream-reports.md')}#{self.report}"


@dataclass(frozen=True)
class State:
    """What install_all does (or did) with one workaround, and why."""

    workaround: Workaround
    on: bool
    why: str
    warn: bool = False  # an untested aibrix-kvcache, a missing need or a deprecated variable

    def line(self) -> str:
        return f"{self.workaround.name} {'on' if self.on else 'off'}: {self.why}"


_CACHE_MANAGER = "aibrix_kvcache.cache_manager"
_L2_CACHE = "aibrix_kvcache.l2.l2_cache"
_L1_CACHE = "aibrix_kvcache.l1.l1_cache"
_PLACEMENT = "aibrix_kvcache.l2.placement.placement"
_HASHABLE = "aibrix_kvcache.cache_hashable"
_ALLOCATOR = "aibrix_kvcache.memory.allocator"
_PD = "aibrix_kvcache.integration.vllm.kv_connector.aibrix_pd_reuse_connector"

# backends.py: how a cache manager's L2 backend is found (every installed workaround uses it).
_BACKEND_NEEDS = (
    Need(_CACHE_MANAGER, "BaseKVCacheManager._l2_cache"),
    Need(_L2_CACHE, "L2Cache._backend"),
    Need(_PLACEMENT, "BasePlacement.members"),
    Need(_PLACEMENT, "Member.conn"),
)

TIMEOUTS = Workaround(
    name="PATCH_TIMEOUTS",
    fixes="a timed-out L2 get ran on memory the cache manager had already released",
    report="a-timed-out-l2-get-runs-on-memory-the-cache-manager-already-released",
    versions=REQUIREMENT,
    untested=INSTALL,  # harmless where AIBrix orders its own timeouts; memory safety where it does not
    install=lambda connector, _counters: timeouts.order_timeouts(connector),
    needs=(
        Need(_CACHE_MANAGER, "asyncio"),  # the module global the workaround replaces
        Need(_CACHE_MANAGER, "BaseKVCacheManager._acquire_impl", params=("self",)),
        *_BACKEND_NEEDS,
    ),
    aliases=(Alias("AIBRIX_EIC_DISABLE_TIMEOUT_ORDERING", off=True),),
)

INGESTION = Workaround(
    name="PATCH_INGESTION",
    fixes="synchronous L1 ingestion made one L2 put and one event-loop round trip per block",
    report="synchronous-l1-ingestion-costs-one-event-loop-round-trip-per-block-inside-the-request",
    versions=REQUIREMENT,
    untested=SKIP,  # a speed-up resting on L1 and manager internals: not worth a guess
    install=lambda connector, counters: ingestion.batch_ingestion(connector, counters),
    needs=(
        Need(_L1_CACHE, "L1Cache.set_on_hot_access_callback", params=("self", "on_hot_access")),
        Need(_L1_CACHE, "L1Cache.set_on_put_callback", params=("self", "functor")),
        Need(_L1_CACHE, "L1Cache.acquire", params=("self", "prefix", "query")),
        Need(_L1_CACHE, "L1Cache.put", params=("self", "prefix", "query", "kv_tensors")),
        Need(_CACHE_MANAGER, "BaseKVCacheManager._l2_ingestion_callback", params=("self", "key", "mr")),
        Need(_CACHE_MANAGER, "BaseKVCacheManager._l2_inflight_quota"),
        Need(_CACHE_MANAGER, "BaseKVCacheManager._event_loop"),
        Need(_CACHE_MANAGER, "BaseKVCacheManager._release", params=("self", "mr_or_handle_or_tensors")),
        Need(_L2_CACHE, "L2Cache.put", params=("self", "prefix", "query", "kv_tensors")),
        Need(_HASHABLE, "BlockHashes._data"),
        Need(_HASHABLE, "BlockHashes.block_ntokens"),
        Need(_HASHABLE, "TokenListView._data"),
        Need(_HASHABLE, "TokenListView._start"),
        Need(_HASHABLE, "TokenListView._stop"),
        Need(_HASHABLE, "TokenListView._meta_"),
        *_BACKEND_NEEDS,
    ),
    aliases=(Alias("AIBRIX_EIC_BATCHED_INGESTION", off=False),),
)

FLUSH = Workaround(
    name="PATCH_FLUSH",
    fixes="the PD prefiller's flush() did not wait for the L2 backend's writes",
    report="pd-reuse-the-prefillers-flush-did-not-wait-for-the-l2-backends-writes",
    versions=REQUIREMENT,
    untested=INSTALL,  # waits longer at worst; without it a decoder may read before the prefiller's writes land
    install=lambda connector, _counters: flush.flush_waits_for_writes(connector),
    needs=(Need(_CACHE_MANAGER, "BaseKVCacheManager.flush", params=("self",)), *_BACKEND_NEEDS),
)

WORKAROUNDS = (TIMEOUTS, INGESTION, FLUSH)

# Not installed by us: the names the connector's own code reads (tokens.py)
# and pd/connector.py's subclasses of AIBrix's PD connector rely on. pd/
# needs vLLM and is never imported here; this is its declaration as data.
TOKENS_NEEDS = (
    Need(_ALLOCATOR, "ManagedMemoryRegion.MAGIC"),
    Need(_ALLOCATOR, "ManagedMemoryRegion.calculate_size", params=("block_nbytes", "ntokens")),
    Need(_ALLOCATOR, "ManagedMemoryRegion._block_nbytes"),
    Need(_ALLOCATOR, "ManagedMemoryRegion._prefix"),
    Need(_ALLOCATOR, "ManagedMemoryRegion._query"),
    Need(_ALLOCATOR, "ManagedMemoryRegion.unpack_tokens", params=("self",)),
)
PD_NEEDS = (
    Need(_PD, "AIBrixPDReuseConnector", bases=("KVConnectorBase_V1",)),
    Need(_PD, "AIBrixPDReuseConnector.__init__", params=("self", "config", "role", "kv_cache_config")),
    Need(_PD, "AIBrixPDReuseConnector.connector_scheduler"),
    Need(_PD, "AIBrixPDReuseConnector.connector_worker"),
    Need(_PD, "AIBrixPDReuseConnectorScheduler.__init__", params=("self", "config")),
    Need(_PD, "AIBrixPDReuseConnectorScheduler.get_num_new_matched_tokens", params=("self", "request")),
    Need(_PD, "AIBrixPDReuseConnectorScheduler.update_state_after_alloc", params=("self", "request", "blocks")),
    Need(_PD, "AIBrixPDReuseConnectorScheduler.request_finished", params=("self", "request", "block_ids")),
    Need(_PD, "AIBrixPDReuseConnectorWorker.__init__", params=("self", "config")),
    Need(_PD, "AIBrixPDReuseConnectorWorker._recv_kv_from_cache_impl", params=("self", "seq_request_meta")),
    Need(_PD, "AIBrixPDReuseConnectorWorker._received_requests"),
    Need(_PD, "AIBrixPDReuseConnectorWorker._meta_cache"),
    Need(_PD, "AIBrixPDReuseConnectorWorker.engine_block_ntokens"),
    Need(_PD, "AIBrixPDReuseConnectorScheduler.build_connector_meta", params=("self", "scheduler_output")),
    Need(_PD, "AIBrixPDReuseConnectorWorker._update_meta_cache", params=("self", "metadata")),
    Need(_PD, "AIBrixPDReuseConnectorMetadata.requests"),
    Need(_PD, "AIBrixPDReuseConnectorCachedMeta.context_slot_mapping"),
    # pd/padding.py: the padded tail of a partial last block, and the view keyed on it
    Need(_PD, "AIBrixPDReuseConnectorCachedMeta.enable_padding"),
    Need(_PD, "AIBrixPDReuseConnectorCachedMeta.prompt_len"),
    Need(_PD, "AIBrixPDReuseConnectorCachedMeta.context_tokens"),
    Need(_PD, "AIBrixPDReuseConnectorCachedMeta.context_tokens_view"),
    Need(_PD, "AIBrixPDReuseConnectorRequestMetadata.req_id"),
    Need(_PD, "AIBrixPDReuseConnectorRequestMetadata.prompt_len"),
    Need(_PD, "AIBrixPDReuseConnectorRequestMetadata.context_len"),
    Need(_PD, "AIBrixPDReuseConnectorRequestMetadata.do_remote_prefill"),
)
# Every declaration of needs, by who relies on them (the private-names test iterates this).
RELIANCES: dict[str, tuple[Need, ...]] = {
    **{w.name: w.needs for w in WORKAROUNDS},
    "aibrix_compat/tokens.py": TOKENS_NEEDS,
    "pd/connector.py": PD_NEEDS,
}


def aibrix_version() -> str | None:
    try:
        return metadata.version("aibrix-kvcache")
    except metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.8.1rc2" -> (0, 8, 1)."""
    numbers = []
    for part in version.split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(numbers)


def in_range(version: str, versions: tuple[str, str]) -> bool:
    low, high = (release(bound.lstrip("<>=")) for bound in versions)
    return low <= release(version) < high


def _opt_out(workaround: Workaround, environ: Mapping[str, str]) -> tuple[bool, str, bool]:
    """(off, why, warn) from the opt-out variable, or a deprecated alias
    when the variable is not set. A value that is not a flag is ignored,
    with a warning."""
    raw = environ.get(workaround.opt_out, "").strip()
    if raw:
        try:
            return (not parse_flag(raw)), f"{workaround.opt_out}={raw}", False
        except ValueError:
            return False, f"{workaround.opt_out}={raw!r} is not a flag (0 or 1), ignored", True
    for alias in workaround.aliases:
        raw = environ.get(alias.env, "").strip()
        if not raw:
            continue
        note = f"{alias.env} is deprecated, set {workaround.opt_out}=0 instead"
        try:
            off = parse_flag(raw) == alias.off
        except ValueError:
            return False, f"{alias.env}={raw!r} is not a flag, ignored ({note})", True
        return off, f"{alias.env}={raw} ({note})", True
    return False, "", False


def decide(workaround: Workaround, environ: Mapping[str, str] = os.environ, version: str | None = None) -> State:
    """What install_all does with `workaround` in this environment on this
    aibrix-kvcache (`version`, by default the installed one)."""
    off, said, warn = _opt_out(workaround, environ)
    if off:
        return State(workaround, False, f"opted out: {said}", warn)
    note = f"; {said}" if said else ""
    version = aibrix_version() if version is None else version
    if version is None:
        return State(workaround, False, "aibrix-kvcache is not installed", True)
    if not in_range(version, workaround.versions):
        span = ",".join(workaround.versions)
        return State(workaround, False, f"aibrix-kvcache {version} is outside {span}, the versions it applies to", True)
    if version != TESTED:
        untested = f"aibrix-kvcache {version} is not {TESTED}, the version it is tested on"
        if workaround.untested == SKIP:
            return State(workaround, False, f"{untested}: skipped{note}", True)
        gone = missing(workaround.needs)
        if gone:
            return State(workaround, False, f"{untested}, and it lacks {gone[0]}: skipped{note}", True)
        return State(workaround, True, f"{untested}; every AIBrix name it uses is there: installed{note}", True)
    return State(workaround, True, f"aibrix-kvcache {version} (turn off with {workaround.opt_out}=0){note}", warn)


def states(environ: Mapping[str, str] = os.environ) -> list[State]:
    """Each workaround's decision in this environment, in declaration order."""
    return [decide(workaround, environ) for workaround in WORKAROUNDS]


_install_lock = threading.Lock()
_said: set[str] = set()  # the state lines logged already (once per process each)


def install_all(connector: object, counters: Any = None, environ: Mapping[str, str] = os.environ) -> list[State]:
    """Install every workaround this environment allows for the cache
    managers whose L2 backend is `connector`. Idempotent and thread-safe:
    a class or module is patched once per process, under one lock; each
    call adds the connector to the workarounds' sets. Never raises."""
    results = []
    with _install_lock:
        for workaround in WORKAROUNDS:
            state = decide(workaround, environ)
            if state.on and workaround.install is not None:
                try:
                    if not workaround.install(connector, counters):
                        state = State(workaround, False, "not installed: AIBrix's cache manager is not loaded")
                except Exception as e:  # a changed AIBrix: stock behaviour beats a dead worker
                    state = State(workaround, False, f"failed to install: {e!r}", True)
            _say(state)
            results.append(state)
    return results


def _say(state: State) -> None:
    line = state.line()
    if line in _said:
        return
    _said.add(line)
    logger.log(logging.WARNING if state.warn else logging.INFO, "EIC: AIBrix workaround %s", line)
