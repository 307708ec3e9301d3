"""EICConnector: AIBrix's L2 `Connector` interface over an EIC SDK module.

Data path: AIBrix coroutine -> checks -> encode keys -> dispatch (SDK calls
of at most `batch_keys` keys and `batch_bytes` bytes, run on the link's
pools) -> outcomes -> Status list. What it guarantees, and why:

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
import functools
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

import torch
from aibrix_kvcache.l2.connectors import Connector, ConnectorFeature
from aibrix_kvcache.memory import MemoryRegion
from aibrix_kvcache.status import Status, StatusCodes

from . import live
from .aibrix_compat import order_timeouts
from .checks import BlockChecker, InvalidRequest, check_lengths, eic_keys, slab_regions
from .codec import KeyCodec
from .config import ConfigError, EICConfig, warn_about_env
from .counters import Counters
from .direct import DirectRequests
from .dispatch import Dispatcher
from .exists_batch import ExistsBatcher
from .identity import ModelIdentity, announce, resolve_identity
from .link import Link
from .logs import RateLimitedLogger
from .metrics import for_connector
from .outcomes import DELETE_SKIPPED, FAST_MISS, OK, PUT_SKIPPED, request_outcome
from .resilience import CircuitBreaker
from .sdk import load_sdk_module
from .teardown import close_may_wait
from .tokens import restore_tokens, with_tokens
from .write_behind import WriteBehind

logger = logging.getLogger(__name__)

# The requests the metrics count, by their name there; get() and put() go
# through mget() and mput(), so each request is counted once. exists() is
# counted by the exists batcher (exists_batch.py), the one owner of its series.
METRIC_OPS = {"mget": "get", "mput": "put", "delete": "delete"}


def never_raises(op: str):
    """Turn any exception of an async op into a Status (bad input INVALID,
    a bug ERROR), and count the request in the metrics."""
    metric_op = METRIC_OPS.get(op)

    def decorate(method):
        @functools.wraps(method)
        async def wrapper(self, *args, **kwargs):
            started = time.perf_counter() if metric_op is not None else 0.0
            try:
                result = await method(self, *args, **kwargs)
            except asyncio.CancelledError:
                raise
            except InvalidRequest as e:
                self._counters.add(invalid=1)
                result = Status(StatusCodes.INVALID, f"{op}: {e}")
                if op == "exists":
                    self._exists.count(result)
            except BaseException as e:  # AssertionError too: nothing escapes
                self._rate_log.log(f"{op}-internal", logging.ERROR, "EIC %s failed internally: %r", op, e)
                result = Status(StatusCodes.ERROR, f"{op} failed internally: {e!r}")
                if op == "exists":
                    self._exists.count(result)
            if metric_op is not None and self._metrics.enabled:
                try:
                    outcome = request_outcome(metric_op, result)
                    self._metrics.record_request(metric_op, outcome, result, args, time.perf_counter() - started)
                except Exception as e:  # metrics never cost a request its answer
                    self._rate_log.log("metrics", logging.WARNING, "EIC metrics failed: %r", e)
            return result

        return wrapper

    return decorate


class EICConnector(Connector[bytes, torch.Tensor]):
    """AIBrix L2 connector for EIC (or the embedded engine)."""

    def __init__(
        self,
        config: EICConfig | None,
        conn_id: str,
        executor: Executor | None = None,  # AIBrix's; SDK calls run on the link's own pools
        config_error: ConfigError | None = None,
    ) -> None:
        self.conn_id = conn_id
        self._feature = ConnectorFeature(mput_mget=True, rdma=True)  # rdma: AIBrix hands us its slabs to register
        self._config = config or EICConfig()
        self._config_error = config_error
        module = None
        if config_error is None:
            try:
                module = load_sdk_module(self._config)
            except ConfigError as e:
                self._config_error = e
        self._identity = resolve_identity(self._config.model_id)
        self._codec = KeyCodec(conn_id, self._config.eic_kv_ns, self._identity.token)
        self._metrics = for_connector(self._config, conn_id)
        self._counters = Counters(self._metrics)
        self._rate_log = RateLimitedLogger(logger)
        self._link = Link(self._config, module, self._codec.prefix, self._counters, self._rate_log)
        live.add(self)  # for aibrix_eic.health()
        self._blocks = BlockChecker(
            self._link.regions, self._config.max_value_bytes, self._config.require_registration,
            self._config.block_nbytes,
        )  # fmt: skip
        self._dispatcher = Dispatcher(self._config, self._link, self._counters, self._rate_log)
        self._exists = ExistsBatcher(self._config, self._link, self._counters)
        self._write_behind = WriteBehind(self._config, self._link, self._dispatcher, self._counters, self._rate_log)
        if self._metrics.enabled:  # not NO_METRICS: that one is shared
            self._metrics.pending_bytes = self._write_behind.pending_bytes
        self._direct = DirectRequests(
            self._config,
            self._link,
            self._codec,
            self._blocks,
            self._dispatcher,
            self._counters,
            self._write_behind.outlived,
        )

    # ------------------------------------------------------------ factory
    @classmethod
    def from_envs(cls, conn_id: str, executor: Executor, **kwargs) -> "EICConnector":
        """Build from the YAML named by AIBRIX_KV_CACHE_OL_EIC_CONFIG (or the
        upstream AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE). A bad config does not
        raise here: open() returns INVALID with the message."""
        warn_about_env()
        config, error = None, None
        try:
            config = EICConfig.from_env()
        except ConfigError as e:
            error = e
        connector = cls(config, conn_id, executor, config_error=error)
        order_timeouts(connector)  # AIBrix's cache manager is loaded: it is building us
        return connector

    # ---------------------------------------------------------- properties
    @property
    def name(self) -> str:
        return "aibrix_eic"

    @property
    def feature(self) -> ConnectorFeature:
        return self._feature  # built once: L2Cache reads it several times per request

    @property
    def config(self) -> EICConfig:
        return self._config

    @property
    def model_identity(self) -> ModelIdentity:
        """What this connector's keys say about the model (identity.py)."""
        return self._identity

    @property
    def link(self) -> Link:
        """The client, pools and breaker: for tools and tests that watch them."""
        return self._link

    @property
    def write_behind(self) -> WriteBehind:
        """The put queue (put_mode coalesce or write_behind): wait_idle()."""
        return self._write_behind

    @property
    def breaker(self) -> CircuitBreaker:
        return self._link.breaker

    @property
    def is_open(self) -> bool:
        return self._link.is_open

    def health(self) -> dict[str, Any]:
        """The connector's state and counters, for operators and tools; a
        public, stable call (fields in docs/operations.md#health). The
        `aibrix_eic_*` metrics export the same counters, and
        `aibrix_eic.health()` returns this for every connector in the process."""
        link = self._link
        snapshot = link.breaker.snapshot()
        return {
            "open": link.is_open,
            "remote_url": self._config.remote_url,
            "namespace": self._config.eic_kv_ns,
            "conn_id": self.conn_id,
            "model_identity": self._identity.describe(),
            "connected": link.session is not None,
            "registered_regions": len(link.regions),
            "breaker": snapshot.state.value,
            "breaker_trips": snapshot.trips,
            "breaker_reason": snapshot.reason,
            "consecutive_failures": snapshot.consecutive_failures,
            **self._counters.snapshot(),
            **self._write_behind.snapshot(),
        }

    # ----------------------------------------------------------- lifecycle
    def open(self) -> Status:
        """Initialise the client. Idempotent; after a failed open, a later
        open() tries again. With fail_open (default) an unreachable EIC does
        not fail open(): the breaker starts open and a probe connects later."""
        try:
            if self._config_error is not None:
                return Status(StatusCodes.INVALID, str(self._config_error))
            if self._link.is_open:
                return OK
            status = self._link.open()
            if status.is_ok():
                self._write_behind.start()
                logger.info(
                    "EIC connector open: remote_url=%s ns=%r conn_id=%s io_threads=%d connected=%s",
                    self._config.remote_url,
                    self._config.eic_kv_ns,
                    self.conn_id,
                    self._config.eic_thread_num,
                    self._link.session is not None,
                )
                announce(self._identity, self._config)
            return status
        except Exception as e:
            return Status(StatusCodes.ERROR, f"EIC open failed: {e!r}")

    def close(self, wait: bool | None = None) -> Status:
        """Drop the client and the registrations. Idempotent.

        wait=True: flush pending writes for up to write_behind_close_timeout_ms,
        drop (as misses) what is left, stop the threads. wait=False: only
        signal the threads; they drop what is queued, release what they hold
        and exit on their own (within a fraction of a second, or when a call
        in flight returns). The default waits unless this is a finalizer or
        one of our threads (teardown.py says why that must never wait).
        """
        try:
            if wait is None:
                wait = close_may_wait()
            if not wait:
                self._write_behind.abandon()
                self._link.abandon()  # closes the pools and the metrics on the prober's thread
                self._blocks.forget()
                return OK
            self._write_behind.close(self._config.write_behind_close_timeout_ms / 1000)  # needs the link's pools
            self._link.close()
            self._blocks.forget()
            self._metrics.closed()
            return OK
        except Exception as e:
            return Status(StatusCodes.ERROR, f"EIC close failed: {e!r}")

    def __del__(self) -> None:
        try:
            self.close(wait=False)
        except Exception:
            pass

    def register_slabs(self, slabs: list[torch.Tensor]) -> Status:
        """Register AIBrix's slabs with EIC (again on every new client)."""
        try:
            if self._config_error is not None:
                return Status(StatusCodes.INVALID, str(self._config_error))
            regions, cuda_device = slab_regions(slabs)
            nbytes, error = self._link.register(regions, cuda_device)
            self._metrics.registered(sum(n for _, n in self._link.regions.all()))
            if error and self._config.require_registration:
                return Status(StatusCodes.ERROR, error)
            if nbytes:
                logger.info("EIC registered %d slabs (%d bytes)", len(regions), nbytes)
            return OK
        except InvalidRequest as e:
            return Status(StatusCodes.INVALID, f"register_slabs: {e}")
        except Exception as e:
            return Status(StatusCodes.ERROR, f"register_slabs failed: {e!r}")

    # ------------------------------------------------------- request checks
    def _refusal(self) -> Status | None:
        """Why no request can run now, or None."""
        if self._config_error is not None:
            return Status(StatusCodes.INVALID, str(self._config_error))
        if not self._link.is_open:
            return Status(StatusCodes.INVALID, "the EIC connector is closed (call open() first)")
        return None

    # ------------------------------------------------------------ batching
    def get_batches(
        self,
        keys: Sequence[Any],
        mrs: Sequence[MemoryRegion | Sequence[MemoryRegion]],
        batch_size: int,
    ) -> Sequence[Sequence[tuple[bytes, MemoryRegion | Sequence[MemoryRegion]]]]:
        """One batch for the whole request; mget/mput split it into SDK calls.

        L2Cache sums OKs across batches and keeps going after a short one,
        which would count a block after a hole as loaded; with one batch our
        prefix-closed statuses are all it sees.
        """
        try:
            if not MemoryRegion.use_compact_layout():
                # Token-validation layout: keep each block's tokens with its key (see mget).
                keys = [(real_key, with_tokens(real_key, cache_key)) for real_key, cache_key in keys]
            pairs = list(zip(keys, mrs))
        except Exception as e:  # bad input: no batch, so L2Cache sends nothing
            self._rate_log.log("get_batches", logging.WARNING, "EIC get_batches: unusable request: %r", e)
            return []
        return [pairs] if pairs else []

    # ------------------------------------------------------------- reading
    @never_raises("mget")
    async def mget(self, keys: Sequence[bytes], mrs: Sequence[MemoryRegion]) -> Sequence[Status] | Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        check_lengths(keys, mrs)
        if self._write_behind.active:  # accepted writes not yet in EIC are read from their regions
            self._blocks.buffers(mrs, False)  # INVALID names the caller's index, not a sub-request's
            return await self._write_behind.mget(
                eic_keys(self._codec, keys), keys, mrs, self._direct.mget, restore_tokens
            )
        return await self._direct.mget(keys, mrs)

    @never_raises("get")
    async def get(self, key: bytes, mr: MemoryRegion) -> Status:
        statuses = await self.mget([key], [mr])
        return statuses if isinstance(statuses, Status) else statuses[0]

    @never_raises("exists")
    async def exists(self, key: bytes) -> Status:
        """Concurrent exists() calls of one event-loop tick share one mexist
        (L2Cache issues up to op_batch of them at once)."""
        refusal = self._refusal()
        if refusal is not None:
            return self._exists.count(refusal)
        eic_key = eic_keys(self._codec, [key])[0]
        if self._write_behind.active:
            known = self._write_behind.exists(eic_key)
            if known is not None:
                return self._exists.count(known)
        if self._link.usable("meta") is None:
            return self._exists.count(FAST_MISS)
        return await self._exists.exists(eic_key)

    # ------------------------------------------------------------- writing
    @never_raises("mput")
    async def mput(self, keys: Sequence[bytes], mrs: Sequence[MemoryRegion]) -> Sequence[Status] | Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        check_lengths(keys, mrs)
        usable = self._link.usable("data")
        if usable is None:
            return PUT_SKIPPED  # nothing is queued while the circuit is open
        if self._write_behind.enabled:
            buffers = self._blocks.buffers(mrs, True)  # the flusher applies the session's registration
            return await self._write_behind.mput(eic_keys(self._codec, keys), buffers, mrs)
        return await self._direct.mput(usable[0], keys, mrs)

    @never_raises("put")
    async def put(self, key: bytes, mr: MemoryRegion) -> Status:
        statuses = await self.mput([key], [mr])
        return statuses if isinstance(statuses, Status) else statuses[0]

    @never_raises("delete")
    async def delete(self, key: bytes) -> Status:
        refusal = self._refusal()
        if refusal is not None:
            return refusal
        eic_key = eic_keys(self._codec, [key])[0]
        usable = self._link.usable("meta")
        if usable is None:
            return DELETE_SKIPPED
        if self._write_behind.enabled:  # ordered after a write of the key in flight
            self._counters.add(deletes=1)
            return await self._write_behind.delete(eic_key, usable[0])
        return await self._direct.delete(usable[0], eic_key)
