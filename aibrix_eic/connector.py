"""EICConnector: AIBrix's L2 `Connector` interface over an EIC SDK module.

Data path: AIBrix coroutine -> validate -> encode keys -> split into SDK
calls of at most `batch_keys` keys and `batch_bytes` bytes -> run them on our
own thread pools -> per-key outcomes -> Status list. What it guarantees, and
why:

- No exception and no `exit()` reaches AIBrix; every method returns Status.
- mget results are prefix-closed: after the first block that did not load,
  no block is reported OK. `get_batches` returns one batch per request, so
  this holds across the whole request (L2Cache adds up the OKs of every batch
  and the cache manager reads the sum as a loaded prefix).
- mput reports success as a list of OKs only when every block was stored;
  otherwise one error Status (a list with holes crashes L2Cache 0.8.0).
- Memory regions are ref-counted while an SDK call may touch them, so a call
  that outlives its deadline never reads or writes memory AIBrix reused.
- Per-operation deadlines, bounded retries of failed keys, and a circuit
  breaker that turns a down EIC into fast misses until a probe sees it back.
"""

import asyncio
import dataclasses
import functools
import logging
import os
import threading
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Callable, List, Sequence, Tuple

import torch
from aibrix_kvcache.l2.connectors import Connector, ConnectorFeature
from aibrix_kvcache.memory import ManagedMemoryRegion, MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

from .aibrix_compat import restore_packed_tokens
from .codec import KeyCodec
from .config import ENV_CONFIG, ENV_CONFIG_UPSTREAM, ConfigError, EICConfig, config_path_from_env
from .logs import RateLimitedLogger
from .pool import GET_PRIORITY, PUT_PRIORITY, PriorityThreadPool
from .regions import RegisteredRegions
from .resilience import CircuitBreaker, Deadline, ExponentialBackoff, Prober, call_with_timeout
from .sdk import FAIL, HIT, MISS, CallResult, SdkClient, load_sdk_module

logger = logging.getLogger(__name__)

_OK = Status.ok()
_MISS = Status(StatusCodes.NOT_FOUND)
_PUT_SKIPPED = Status(StatusCodes.ERROR, "put skipped: EIC circuit is open (EIC unavailable)")
_DELETE_SKIPPED = Status(StatusCodes.ERROR, "delete skipped: EIC circuit is open (EIC unavailable)")
_MR_TYPES: set[type] = set()  # MemoryRegion subclasses seen; ABC isinstance is slow
_META_THREADS = 4  # exists, delete: small calls kept off the data pool


class _InvalidRequest(Exception):
    """Bad input; becomes Status(INVALID, message)."""


@dataclass
class _Session:
    client: SdkClient
    registration_ok: bool = True  # no register_memory on this client failed
    regions: set[tuple[int, int]] = dataclasses.field(default_factory=set)  # registered on it


class _Chunk:
    """One SDK call's share of a request, and the memory it may touch."""

    __slots__ = ("start", "keys", "buffers", "mrs", "outcomes", "detail")

    def __init__(self, start: int, keys: list[str], buffers: list, mrs: Sequence[MemoryRegion]):
        self.start = start
        self.keys = keys
        self.buffers = buffers
        self.mrs = mrs
        self.outcomes: list[int] | None = None  # set once the SDK answered
        self.detail = ""
        for mr in mrs:
            mr.ref_up()

    def release(self) -> None:
        mrs, self.mrs = self.mrs, ()
        for mr in mrs:
            mr.ref_down()

    def release_if_cancelled(self, future: Future) -> None:
        # A cancelled future never ran, so its thread will not release.
        if future.cancelled():
            self.release()


class _Counters:
    """Operation counters for health(); cheap enough for every request."""

    FIELDS = (
        "gets", "get_blocks", "get_hits", "puts", "put_blocks", "put_failures",
        "exists", "exists_calls", "deletes", "retries", "timeouts", "fast_fails", "invalid",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self.FIELDS, 0)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


def _never_raises(op: str):
    """Turn any exception of an async op into an ERROR Status."""

    def decorate(method):
        @functools.wraps(method)
        async def wrapper(self: "EICConnector", *args, **kwargs):
            try:
                return await method(self, *args, **kwargs)
            except asyncio.CancelledError:
                raise
            except _InvalidRequest as e:
                self._counters.add(invalid=1)
                return Status(StatusCodes.INVALID, f"{op}: {e}")
            except BaseException as e:  # AssertionError too: nothing escapes
                self._rate_log.log(f"{op}-internal", logging.ERROR, "EIC %s failed internally: %r", op, e)
                return Status(StatusCodes.ERROR, f"{op} failed internally: {e!r}")

        return wrapper

    return decorate


class EICConnector(Connector[bytes, torch.Tensor]):
    """AIBrix L2 connector for EIC (or the embedded engine)."""

    def __init__(
        self,
        config: EICConfig | None,
        conn_id: str,
        executor: Executor | None = None,
        config_error: ConfigError | None = None,
    ) -> None:
        self.conn_id = conn_id
        self._executor = executor  # AIBrix's; we run SDK calls on our own pools
        self._config = config or EICConfig()
        self._config_error = config_error
        self._module = None
        if config_error is None:
            try:
                self._module = load_sdk_module(self._config)
            except ConfigError as e:
                self._config_error = e
        self._codec = KeyCodec(conn_id, self._config.eic_kv_ns)
        self._regions = RegisteredRegions()
        self._backoff = ExponentialBackoff(
            self._config.retry_backoff_ms / 1000, self._config.retry_backoff_max_ms / 1000
        )
        self._counters = _Counters()
        self._rate_log = RateLimitedLogger(logger)
        self._state_lock = threading.RLock()
        self._is_open = False
        self._session: _Session | None = None
        self._data_pool: PriorityThreadPool | None = None
        self._meta_pool: PriorityThreadPool | None = None
        self._block_nbytes = self._config.block_nbytes
        self._exists_batches: dict[asyncio.AbstractEventLoop, tuple[list, list]] = {}
        self._new_breaker()

    # ------------------------------------------------------------ factory
    @classmethod
    def from_envs(cls, conn_id: str, executor: Executor, **kwargs) -> "EICConnector":
        """Build from the YAML named by AIBRIX_KV_CACHE_OL_EIC_CONFIG (or the
        upstream AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE). A bad config does not
        raise here: open() returns INVALID with the message."""
        ours, theirs = os.environ.get(ENV_CONFIG), os.environ.get(ENV_CONFIG_UPSTREAM)
        if ours and theirs and ours != theirs:
            logger.warning("%s=%s and %s=%s differ; using %s", ENV_CONFIG, ours, ENV_CONFIG_UPSTREAM, theirs, ours)
        if not config_path_from_env():
            logger.warning(
                "Neither %s nor %s is set: the EIC connector runs on the embedded engine "
                "(local://) with default settings; cached KV lives in this process only",
                ENV_CONFIG,
                ENV_CONFIG_UPSTREAM,
            )
        try:
            config = EICConfig.from_env()
        except ConfigError as e:
            return cls(None, conn_id, executor, config_error=e)
        return cls(config, conn_id, executor)

    # ---------------------------------------------------------- properties
    @property
    def name(self) -> str:
        return "aibrix_eic"

    @property
    def feature(self) -> ConnectorFeature:
        # rdma makes the cache manager hand us its slabs to register.
        return ConnectorFeature(mput_mget=True, rdma=True)

    @property
    def config(self) -> EICConfig:
        return self._config

    @property
    def breaker(self) -> CircuitBreaker:
        return self._breaker

    @property
    def is_open(self) -> bool:
        return self._is_open

    def health(self) -> dict[str, Any]:
        """State an operator (or `aibrix-eic check`) can read."""
        snapshot = self._breaker.snapshot()
        return {
            "open": self._is_open,
            "remote_url": self._config.remote_url,
            "namespace": self._config.eic_kv_ns,
            "conn_id": self.conn_id,
            "connected": self._session is not None,
            "registered_regions": len(self._regions),
            "breaker": snapshot.state,
            "breaker_trips": snapshot.trips,
            "breaker_reason": snapshot.reason,
            "consecutive_failures": snapshot.consecutive_failures,
            **self._counters.snapshot(),
        }

    # ----------------------------------------------------------- lifecycle
    def _new_breaker(self) -> None:
        self._breaker = CircuitBreaker(self._config.breaker_failures, on_change=self._on_breaker_change)
        self._prober = Prober(self._breaker, self._probe, self._config.probe_interval_s)

    def _on_breaker_change(self, state: str, reason: str) -> None:
        if state == CircuitBreaker.OPEN:
            logger.warning(
                "EIC circuit OPEN for %s (%s): gets and exists return NOT_FOUND, puts are "
                "skipped, until a probe (every %gs) sees EIC answer again",
                self._config.remote_url,
                reason,
                self._config.probe_interval_s,
            )
            self._prober.wake()
        else:
            logger.warning("EIC circuit CLOSED for %s: EIC answers again, cache resumed", self._config.remote_url)

    def open(self) -> Status:
        """Initialise the client. Idempotent; after a failed open, a later
        open() tries again. With fail_open (default) an unreachable EIC does
        not fail open(): the breaker starts open and a probe connects later."""
        try:
            with self._state_lock:
                if self._config_error is not None:
                    return Status(StatusCodes.INVALID, str(self._config_error))
                if self._is_open:
                    return _OK
                try:
                    session, error = self._connect()
                except ConfigError as e:
                    return Status(StatusCodes.INVALID, str(e))
                self._data_pool = PriorityThreadPool(self._config.eic_thread_num, "aibrix_eic_data")
                self._meta_pool = PriorityThreadPool(_META_THREADS, "aibrix_eic_meta")
                if session is None and not self._config.fail_open:
                    self._shutdown_pools()
                    return Status(StatusCodes.ERROR, f"EIC open failed: {error}")
                self._new_breaker()
                self._session = session
                self._is_open = True
                if session is None:
                    self._breaker.trip(f"open: {error}")
                self._prober.start()
            logger.info(
                "EIC connector open: remote_url=%s ns=%r conn_id=%s io_threads=%d connected=%s",
                self._config.remote_url,
                self._config.eic_kv_ns,
                self.conn_id,
                self._config.eic_thread_num,
                session is not None,
            )
            if session is not None:
                self._warm_up(session)
            return _OK
        except Exception as e:
            return Status(StatusCodes.ERROR, f"EIC open failed: {e!r}")

    def close(self) -> Status:
        """Drop the client and the registrations. Idempotent."""
        try:
            with self._state_lock:
                self._regions.clear()
                self._block_nbytes = self._config.block_nbytes
                if not self._is_open:
                    return _OK
                self._is_open = False
                self._prober.stop()
                self._session = None
                self._shutdown_pools()
            return _OK
        except Exception as e:
            return Status(StatusCodes.ERROR, f"EIC close failed: {e!r}")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _shutdown_pools(self) -> None:
        for pool in (self._data_pool, self._meta_pool):
            if pool is not None:
                pool.shutdown()
        self._data_pool = self._meta_pool = None

    def _connect(self) -> tuple[_Session | None, str]:
        client, error = SdkClient.connect(self._module, self._config)
        if client is None:
            return None, error
        session = _Session(client)
        regions = self._regions.all()
        if regions:
            error = self._register(session, regions)
            if error and self._config.require_registration:
                return None, error
        return session, ""

    def _register(self, session: _Session, regions: list[tuple[int, int]]) -> str:
        ok, message = session.client.register(regions, self._regions.cuda_device)
        if ok:
            session.regions.update(regions)
            return ""
        session.registration_ok = False
        logger.warning("EIC %s; buffers are passed as unregistered", message)
        return message

    def _warm_up(self, session: _Session) -> None:
        """One bounded mexist over random keys, so the SDK opens its agent
        connections now rather than on the first request."""
        nkeys = self._config.warmup_keys
        if nkeys <= 0:
            return
        keys = [f"{self._codec.prefix}w{os.urandom(12).hex()}" for _ in range(nkeys)]
        started = time.perf_counter()
        finished, result = call_with_timeout(
            lambda: session.client.mexist(keys), self._config.warmup_timeout_ms / 1000, "aibrix_eic_warmup"
        )
        if not finished:
            logger.warning("EIC warm-up did not finish within warmup_timeout_ms=%s", self._config.warmup_timeout_ms)
            return
        logger.info(
            "EIC warm-up: %d probe keys in one mexist, %.1f ms (%s)",
            nkeys,
            (time.perf_counter() - started) * 1000,
            "ok" if not result.whole_call_failed else result.detail,
        )

    def _probe(self) -> bool:
        """Prober callback: True when EIC answers again. Reuses the current
        client if it answers, else builds and initialises a new one."""
        session = self._session
        if session is not None and self._answers(session):
            return True
        try:
            fresh, error = self._connect()
        except ConfigError as e:  # cannot happen after a successful open
            fresh, error = None, str(e)
        if fresh is None:
            self._rate_log.log("probe", logging.INFO, "EIC probe: still unavailable: %s", error)
            return False
        if not self._answers(fresh):
            return False
        with self._state_lock:
            if not self._is_open:
                return False
            # Slabs may have been registered since _connect read the list.
            missing = [region for region in self._regions.all() if region not in fresh.regions]
            if missing:
                self._register(fresh, missing)
            self._session = fresh
        return True

    def _answers(self, session: _Session) -> bool:
        # Own thread, not a pool: hung calls may be holding every pool thread.
        probe_key = f"{self._codec.prefix}p{os.urandom(8).hex()}"
        finished, result = call_with_timeout(
            lambda: session.client.mexist([probe_key]), self._config.exists_timeout_ms / 1000, "aibrix_eic_probe_call"
        )
        return finished and not result.whole_call_failed

    # -------------------------------------------------------- registration
    def register_slabs(self, slabs: List[torch.Tensor]) -> Status:
        """Register AIBrix's slabs with EIC (again on every new client)."""
        try:
            if self._config_error is not None:
                return Status(StatusCodes.INVALID, str(self._config_error))
            if not slabs:
                return Status(StatusCodes.INVALID, "register_slabs: no slabs given")
            regions = []
            for i, slab in enumerate(slabs):
                if not isinstance(slab, torch.Tensor):
                    return Status(StatusCodes.INVALID, f"register_slabs: slabs[{i}] is a {type(slab).__name__}, expected a torch.Tensor")
                nbytes = slab.numel() * slab.element_size()
                if nbytes <= 0:
                    return Status(StatusCodes.INVALID, f"register_slabs: slabs[{i}] is empty")
                regions.append((slab.data_ptr(), nbytes))
            cuda_device = slabs[0].device.index if slabs[0].is_cuda else None
            with self._state_lock:  # against a probe swapping in a new client
                new_regions = self._regions.add(regions, cuda_device)
                session = self._session
                if session is None or not new_regions:
                    return _OK  # registered when a client connects
                error = self._register(session, new_regions)
            if error and self._config.require_registration:
                return Status(StatusCodes.ERROR, error)
            logger.info(
                "EIC registered %d slabs (%d bytes)", len(new_regions), sum(n for _, n in new_regions)
            )
            return _OK
        except Exception as e:
            return Status(StatusCodes.ERROR, f"register_slabs failed: {e!r}")

    # ------------------------------------------------------- request checks
    def _refusal(self) -> Status | None:
        """Why no request can run now, or None."""
        if self._config_error is not None:
            return Status(StatusCodes.INVALID, str(self._config_error))
        if not self._is_open:
            return Status(StatusCodes.INVALID, "the EIC connector is closed (call open() first)")
        return None

    def _encode_keys(self, keys: Sequence[Any]) -> list[str]:
        for i, key in enumerate(keys):
            if not isinstance(key, bytes):
                raise _InvalidRequest(f"keys[{i}] is a {type(key).__name__}, expected bytes")
            if not key:
                raise _InvalidRequest(f"keys[{i}] is empty")
        return self._codec.encode_many(keys)

    def _buffers(self, keys: Sequence[Any], mrs: Sequence[Any], for_put: bool) -> list[tuple[int, int, bool]]:
        """(addr, nbytes, registered) for each MR, after checking the request."""
        compact = MemoryRegion.use_compact_layout()
        block_nbytes = self._block_nbytes
        max_nbytes = self._config.max_value_bytes
        regions = self._regions
        session = self._session
        mark_registered = (
            session is not None and session.registration_ok and (self._config.put_registered or not for_put)
        )
        require = self._config.require_registration
        buffers = []
        known_types = _MR_TYPES
        for i, mr in enumerate(mrs):
            if type(mr) not in known_types:
                if not isinstance(mr, MemoryRegion):
                    raise _InvalidRequest(
                        f"mrs[{i}] is a {type(mr).__name__}, expected a MemoryRegion (GDR MR lists are not supported)"
                    )
                known_types.add(type(mr))
            nbytes = mr.length
            if nbytes <= 0:
                raise _InvalidRequest(f"mrs[{i}] is empty")
            if nbytes > max_nbytes:
                raise _InvalidRequest(f"mrs[{i}] holds {nbytes} bytes, more than max_value_bytes={max_nbytes}")
            if compact:
                if block_nbytes is None:
                    block_nbytes = self._block_nbytes = nbytes
                elif nbytes != block_nbytes:
                    raise _InvalidRequest(
                        f"mrs[{i}] holds {nbytes} bytes but this connector's blocks are {block_nbytes} bytes"
                    )
            addr = mr.data_ptr()
            registered = regions.contains(addr, nbytes)
            if require and not registered:
                raise _InvalidRequest(
                    f"mrs[{i}] at {addr:#x} ({nbytes} bytes) is not inside memory given to register_slabs "
                    "and require_registration is set"
                )
            buffers.append((addr, nbytes, registered and mark_registered))
        return buffers

    def _data_request(
        self, keys: Sequence[Any], mrs: Sequence[Any], for_put: bool
    ) -> tuple[_Session, list[_Chunk]] | None:
        """The session and SDK-call chunks of an mget/mput, or None when the
        circuit is open. The breaker is checked before any per-block work:
        that check is the whole cost of a request while EIC is down."""
        _check_lengths(keys, mrs)
        session = self._session
        if self._breaker.is_open or session is None:
            self._counters.add(fast_fails=1)
            return None
        buffers = self._buffers(keys, mrs, for_put)
        eic_keys = self._encode_keys(keys)
        return session, self._chunks(eic_keys, buffers, mrs)

    def _chunks(self, eic_keys: list[str], buffers: list | None, mrs: Sequence[MemoryRegion] | None) -> list[_Chunk]:
        step = self._config.batch_keys
        if buffers:
            # Big blocks: several calls, so their copies run on several threads.
            step = max(1, min(step, self._config.batch_bytes // buffers[0][1]))
        return [
            _Chunk(
                start,
                eic_keys[start : start + step],
                buffers[start : start + step] if buffers is not None else [],
                mrs[start : start + step] if mrs is not None else (),
            )
            for start in range(0, len(eic_keys), step)
        ]

    # --------------------------------------------------------- SDK calling
    def _observe(self, result: CallResult) -> None:
        if result.whole_call_failed:
            self._breaker.record_failure(result.detail)
            self._rate_log.log("call-failed", logging.WARNING, "EIC call failed: %s", result.detail)
        else:
            self._breaker.record_success()

    def _call_with_retry(
        self,
        call: Callable[[list[str], list], CallResult],
        chunk: _Chunk,
        deadline: Deadline,
        retryable: Callable[[list[int]], list[int]],
    ) -> None:
        """Run one SDK call, then re-send keys it failed (never misses) while
        the retry budget, the deadline and the breaker allow."""
        result = call(chunk.keys, chunk.buffers)
        self._observe(result)
        outcomes, detail = list(result.outcomes), result.detail
        for attempt in range(1, self._config.retry_attempts + 1):
            again = retryable(outcomes)
            if not again or self._breaker.is_open:
                break
            delay = self._backoff.compute(attempt)
            if deadline.remaining() <= delay:
                break
            time.sleep(delay)
            self._counters.add(retries=len(again))
            result = call([chunk.keys[i] for i in again], [chunk.buffers[i] for i in again] if chunk.buffers else [])
            self._observe(result)
            for j, i in enumerate(again):
                outcomes[i] = result.outcomes[j]
            detail = result.detail
        chunk.detail = detail
        chunk.outcomes = outcomes  # last: readers take outcomes as "call finished"

    @staticmethod
    def _failed_before_first_miss(outcomes: list[int]) -> list[int]:
        # Keys after a miss cannot be reported loaded, so refetching them is waste.
        end = outcomes.index(MISS) if MISS in outcomes else len(outcomes)
        return [i for i in range(end) if outcomes[i] == FAIL]

    @staticmethod
    def _failed(outcomes: list[int]) -> list[int]:
        return [i for i, outcome in enumerate(outcomes) if outcome == FAIL]

    def _run_chunk(self, work: Callable[[_Chunk, Deadline], None], chunk: _Chunk, deadline: Deadline) -> None:
        try:
            work(chunk, deadline)
        except BaseException as e:  # a bug here must still yield an answer
            self._rate_log.log("chunk-internal", logging.ERROR, "EIC call failed internally: %r", e)
            chunk.detail = f"internal error {e!r}"
            chunk.outcomes = [FAIL] * len(chunk.keys)
        finally:
            chunk.release()

    async def _run(
        self,
        pool: PriorityThreadPool | None,
        work: Callable[[_Chunk, Deadline], None],
        chunks: list[_Chunk],
        deadline: Deadline,
        op: str,
        timeout_ms: float,
        priority: int = GET_PRIORITY,
    ) -> bool:
        """Run chunks concurrently; True when the deadline passed first.

        Chunks still queued at the deadline are cancelled and never touch
        memory; chunks already in an SDK call keep their memory references
        until the call returns, however late.
        """
        if pool is None:
            for chunk in chunks:
                chunk.release()
            raise RuntimeError("the connector was closed during the request")
        futures = []
        try:
            for chunk in chunks:
                future = pool.submit(self._run_chunk, work, chunk, deadline, priority=priority)
                future.add_done_callback(chunk.release_if_cancelled)
                futures.append(future)
        except RuntimeError:  # pool shut down by close()
            for chunk in chunks[len(futures) :]:
                chunk.release()
            for future in futures:
                future.cancel()
            raise
        loop = asyncio.get_running_loop()
        waiters = [asyncio.wrap_future(future, loop=loop) for future in futures]
        try:
            _, pending = await asyncio.wait(waiters, timeout=deadline.remaining())
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            raise
        if not pending:
            return False
        for future in futures:
            future.cancel()
        self._counters.add(timeouts=1)
        self._breaker.record_failure(f"{op} exceeded {op}_timeout_ms={timeout_ms:g}")
        self._rate_log.log(
            f"{op}-timeout", logging.WARNING, "EIC %s exceeded %s_timeout_ms=%g", op, op, timeout_ms
        )
        return True

    @staticmethod
    def _statuses(chunks: list[_Chunk], op: str, timeout_ms: float) -> tuple[list[Status], int]:
        """Per-key Status from chunk outcomes (None outcomes: not answered),
        and the index of the first key that is not OK (len if none)."""
        statuses: list[Status] = []
        first_bad = -1
        timeout_status = None
        for chunk in chunks:
            outcomes = chunk.outcomes
            if outcomes is None:
                if timeout_status is None:
                    timeout_status = Status(StatusCodes.TIMEOUT, f"{op} exceeded {op}_timeout_ms={timeout_ms:g}")
                if first_bad < 0:
                    first_bad = len(statuses)
                statuses.extend([timeout_status] * len(chunk.keys))
                continue
            if outcomes.count(HIT) == len(outcomes):
                statuses.extend([_OK] * len(outcomes))
                continue
            error_status = None
            for outcome in outcomes:
                if outcome == HIT:
                    statuses.append(_OK)
                    continue
                if first_bad < 0:
                    first_bad = len(statuses)
                if outcome == MISS:
                    statuses.append(_MISS)
                else:
                    if error_status is None:
                        error_status = Status(StatusCodes.ERROR, f"{op}: {chunk.detail}")
                    statuses.append(error_status)
        return statuses, (len(statuses) if first_bad < 0 else first_bad)

    # ------------------------------------------------------------ batching
    def get_batches(
        self,
        keys: Sequence[Any],
        mrs: Sequence[MemoryRegion | Sequence[MemoryRegion]],
        batch_size: int,
    ) -> Sequence[Sequence[Tuple[bytes, MemoryRegion | Sequence[MemoryRegion]]]]:
        """One batch for the whole request; mget/mput split it into SDK calls.

        L2Cache sums OKs across batches and keeps going after a short one,
        which would count a block after a hole as loaded; with one batch our
        prefix-closed statuses are all it sees.
        """
        pairs = list(zip(keys, mrs))
        return [pairs] if pairs else []

    # ------------------------------------------------------------- reading
    @_never_raises("mget")
    async def mget(self, keys: Sequence[bytes], mrs: Sequence[MemoryRegion]) -> Sequence[Status] | Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        request = self._data_request(keys, mrs, for_put=False)
        if request is None:
            return [_MISS] * len(keys)
        session, chunks = request
        timeout_ms = self._config.get_timeout_ms
        deadline = Deadline(timeout_ms / 1000)
        work = functools.partial(self._call_with_retry, session.client.mget, retryable=self._failed_before_first_miss)
        await self._run(self._data_pool, work, chunks, deadline, "get", timeout_ms)
        statuses, loaded = self._statuses(chunks, "get", timeout_ms)
        _close_after(statuses, loaded)
        if loaded and not MemoryRegion.use_compact_layout():
            loaded = self._restore_tokens(mrs, statuses, loaded)
        self._counters.add(gets=1, get_blocks=len(keys), get_hits=loaded)
        return statuses

    @staticmethod
    def _restore_tokens(mrs: Sequence[MemoryRegion], statuses: list[Status], loaded: int) -> int:
        """Token-validation layout: hand L2Cache correctly parsed tokens (see
        aibrix_compat); a block without a well-formed footer ends the prefix."""
        for i in range(loaded):
            mr = mrs[i]
            if isinstance(mr, ManagedMemoryRegion) and not restore_packed_tokens(mr):
                statuses[i] = Status(StatusCodes.NOT_FOUND, f"block {i}: stored value has no valid token footer")
                _close_after(statuses, i)
                return i
        return loaded

    @_never_raises("get")
    async def get(self, key: bytes, mr: MemoryRegion) -> Status:
        statuses = await self.mget([key], [mr])
        return statuses if isinstance(statuses, Status) else statuses[0]

    @_never_raises("exists")
    async def exists(self, key: bytes) -> Status:
        """Concurrent exists() calls of one event-loop tick share one mexist
        (L2Cache issues up to op_batch of them at once)."""
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        eic_key = self._encode_keys([key])[0]
        if self._breaker.is_open or self._session is None:
            self._counters.add(fast_fails=1)
            return _MISS
        loop = asyncio.get_running_loop()
        batch = self._exists_batches.get(loop)
        if batch is None:
            batch = self._exists_batches[loop] = ([], [])
            loop.call_soon(self._flush_exists, loop)
        waiter = loop.create_future()
        batch[0].append(eic_key)
        batch[1].append(waiter)
        return await waiter

    def _flush_exists(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the keys of this loop tick as mexist calls. Answers come back
        through call_soon_threadsafe, or as TIMEOUT from a loop timer; no
        task or future chain sits in between, which keeps a round of
        L2Cache.exists close to one SDK round trip."""
        eic_keys, waiters = self._exists_batches.pop(loop)
        try:
            session, pool = self._session, self._meta_pool
            if self._breaker.is_open or session is None or pool is None:
                self._counters.add(fast_fails=1)
                _answer(waiters, 0, len(waiters), _MISS)
                return
            timeout_ms = self._config.exists_timeout_ms
            step = self._config.batch_keys
            spans = [(start, min(start + step, len(eic_keys))) for start in range(0, len(eic_keys), step)]
            futures: list[Future] = []
            timer = loop.call_later(timeout_ms / 1000, self._exists_timed_out, waiters, futures, timeout_ms)
            unanswered = [len(spans)]

            def deliver(start: int, end: int, future: Future) -> None:  # on the loop
                _answer_exists(waiters, start, end, future)
                unanswered[0] -= 1
                if unanswered[0] == 0:
                    timer.cancel()

            def on_done(future: Future, start: int, end: int) -> None:  # on a pool thread
                try:
                    loop.call_soon_threadsafe(deliver, start, end, future)
                except RuntimeError:
                    pass  # the loop is closed: nobody waits any more

            for start, end in spans:
                future = pool.submit(self._mexist_call, session, eic_keys[start:end])
                future.add_done_callback(functools.partial(on_done, start=start, end=end))
                futures.append(future)
            self._counters.add(exists=len(eic_keys), exists_calls=len(spans))
        except BaseException as e:
            _answer(waiters, 0, len(waiters), Status(StatusCodes.ERROR, f"exists failed internally: {e!r}"))

    def _mexist_call(self, session: _Session, eic_keys: list[str]) -> CallResult:
        result = session.client.mexist(eic_keys)
        self._observe(result)
        return result

    def _exists_timed_out(self, waiters: list[asyncio.Future], futures: list[Future], timeout_ms: float) -> None:
        if all(waiter.done() for waiter in waiters):
            return
        for future in futures:
            future.cancel()
        self._counters.add(timeouts=1)
        self._breaker.record_failure(f"exists exceeded exists_timeout_ms={timeout_ms:g}")
        self._rate_log.log("exists-timeout", logging.WARNING, "EIC exists exceeded exists_timeout_ms=%g", timeout_ms)
        _answer(waiters, 0, len(waiters), Status(StatusCodes.TIMEOUT, f"exists exceeded exists_timeout_ms={timeout_ms:g}"))

    # ------------------------------------------------------------- writing
    @_never_raises("mput")
    async def mput(self, keys: Sequence[bytes], mrs: Sequence[MemoryRegion]) -> Sequence[Status] | Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        request = self._data_request(keys, mrs, for_put=True)
        if request is None:
            return _PUT_SKIPPED
        session, chunks = request
        timeout_ms = self._config.put_timeout_ms
        deadline = Deadline(timeout_ms / 1000)
        work = functools.partial(self._call_with_retry, session.client.mset, retryable=self._failed)
        await self._run(self._data_pool, work, chunks, deadline, "put", timeout_ms, PUT_PRIORITY)
        statuses, first = self._statuses(chunks, "put", timeout_ms)
        stored = len(keys) if first == len(keys) else sum(1 for status in statuses if status.is_ok())
        self._counters.add(puts=1, put_blocks=len(keys), put_failures=len(keys) - stored)
        if stored == len(keys):
            return statuses
        reason = statuses[first]
        return Status(
            reason.error_code,
            f"{len(keys) - stored} of {len(keys)} blocks not stored; first is block {first}: {reason.value}",
        )

    @_never_raises("put")
    async def put(self, key: bytes, mr: MemoryRegion) -> Status:
        statuses = await self.mput([key], [mr])
        return statuses if isinstance(statuses, Status) else statuses[0]

    @_never_raises("delete")
    async def delete(self, key: bytes) -> Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        eic_keys = self._encode_keys([key])
        session = self._session
        if self._breaker.is_open or session is None:
            self._counters.add(fast_fails=1)
            return _DELETE_SKIPPED
        timeout_ms = self._config.delete_timeout_ms
        chunks = self._chunks(eic_keys, None, None)
        work = functools.partial(
            self._call_with_retry, lambda keys, _: session.client.mdel(keys), retryable=self._failed
        )
        await self._run(self._meta_pool, work, chunks, Deadline(timeout_ms / 1000), "delete", timeout_ms)
        self._counters.add(deletes=1)
        return self._statuses(chunks, "delete", timeout_ms)[0][0]


def _answer(waiters: list[asyncio.Future], start: int, end: int, status: Status) -> None:
    for waiter in waiters[start:end]:
        if not waiter.done():  # AIBrix may have cancelled it
            waiter.set_result(status)


def _answer_exists(waiters: list[asyncio.Future], start: int, end: int, future: Future) -> None:
    """Answer waiters[start:end] from a finished mexist future."""
    if future.cancelled():
        # By the timeout (its waiters are answered, and skipped here) or by
        # close() shutting the pool down, which must not leave anyone waiting.
        _answer(waiters, start, end, Status(StatusCodes.CANCELLED, "exists cancelled: the connector was closed"))
        return
    error = future.exception()
    if error is not None:
        _answer(waiters, start, end, Status(StatusCodes.ERROR, f"exists failed internally: {error!r}"))
        return
    result: CallResult = future.result()
    failure = None
    for waiter, outcome in zip(waiters[start:end], result.outcomes):
        if waiter.done():
            continue
        if outcome == HIT:
            waiter.set_result(_OK)
        elif outcome == MISS:
            waiter.set_result(_MISS)
        else:
            failure = failure or Status(StatusCodes.ERROR, f"exists: {result.detail}")
            waiter.set_result(failure)


def _check_lengths(keys: Sequence[Any], mrs: Sequence[Any]) -> None:
    if len(keys) == 0:
        raise _InvalidRequest("empty request: no keys")
    if len(keys) != len(mrs):
        raise _InvalidRequest(f"{len(keys)} keys but {len(mrs)} memory regions")


def _close_after(statuses: list[Status], first_bad: int) -> None:
    """Make statuses prefix-closed: nothing after the first non-OK is OK."""
    rest = len(statuses) - first_bad - 1
    if rest > 0:
        tail = Status(
            StatusCodes.NOT_FOUND,
            f"not loaded: block {first_bad} of {len(statuses)} was not ({statuses[first_bad].error_code.name})",
        )
        statuses[first_bad + 1 :] = [tail] * rest
