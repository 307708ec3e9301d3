"""The EIC connector's construction and lifecycle: its parts, built and
wired once from the config; open, close and register_slabs; the properties
tools read and health(). The requests AIBrix makes (mget, mput, exists,
delete) are EICConnector's, in connector.py.
"""

import logging
from concurrent.futures import Executor
from typing import Any, Self

import torch
from aibrix_kvcache.l2.connectors import Connector, ConnectorFeature
from aibrix_kvcache.status import Status, StatusCodes

from .aibrix_compat.registry import install_all
from .config import ConfigError, EICConfig, warn_about_env
from .keys.codec import KeyCodec
from .keys.identity import ModelIdentity, announce, resolve_identity
from .link.link import Link
from .link.resilience import CircuitBreaker
from .link.runtime import Runtime
from .link.sdk import load_sdk_module
from .observability import health as live
from .observability.counters import Counters
from .observability.metrics import for_connector
from .observability.reuse import ReuseLog
from .request.checks import BlockChecker, InvalidRequest, slab_regions
from .request.direct import DirectRequests
from .request.dispatch import Dispatcher
from .request.exists import ExistsBatcher
from .request.statuses import OK
from .util.rate_limited_log import RateLimitedLogger
from .util.teardown import call_at_exit, close_may_wait
from .writes.write_behind import WriteBehind

logger = logging.getLogger(__name__)


class ConnectorLifecycle(Connector[bytes, torch.Tensor]):
    """How an EIC connector is built, opened, closed and watched; EICConnector
    (connector.py) adds the requests."""

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
        self._reuse = ReuseLog()
        self._link = Link(self._config, module, self._codec.prefix, self._counters, self._rate_log)
        live.add(self)  # for aibrix_eic.health()
        self._blocks = BlockChecker(
            self._link.regions,
            self._config.max_value_bytes,
            self._config.require_registration,
            self._config.block_nbytes,
        )
        rt = Runtime(self._config, self._link, self._counters, self._rate_log)
        self._dispatcher = Dispatcher(rt)
        self._exists = ExistsBatcher(rt)
        self._write_behind = WriteBehind(rt, self._dispatcher)
        self._metrics.watch_pending_bytes(self._write_behind.pending_bytes)
        self._metrics.watch_store_usage(self._link.store_usage)
        self._direct = DirectRequests(rt, self._codec, self._blocks, self._dispatcher, self._write_behind.outlived)

    # ------------------------------------------------------------ factory
    @classmethod
    def from_envs(cls, conn_id: str, executor: Executor, **kwargs: Any) -> Self:
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
        # AIBrix's cache manager is loaded (it is building us) and has not
        # registered its L1 callbacks yet: aibrix_compat/registry.py's workarounds.
        install_all(connector, connector._counters)
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
        """What this connector's keys say about the model (keys/identity.py)."""
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
                call_at_exit(*self._write_behind.exit_hooks)
                logger.info(
                    "EIC connector open: remote_url=%s ns=%r conn_id=%s io_threads=%d connected=%s",
                    self._config.remote_url,
                    self._config.eic_kv_ns,
                    self.conn_id,
                    self._config.eic_thread_num,
                    self._link.session is not None,
                )
                announce(self._identity, self._config)
                self._metrics.opened(self._identity.token)
            return status
        except Exception as e:
            return Status(StatusCodes.ERROR, f"EIC open failed: {e!r}")

    def close(self, wait: bool | None = None) -> Status:
        """Drop the client and the registrations. Idempotent.

        wait=True: flush pending writes for up to write_behind_close_timeout_ms,
        drop (as misses) what is left, stop the threads. wait=False: return
        at once; the threads go on sending what is queued for up to
        write_behind_close_timeout_ms with nobody waiting, then drop what is
        left (misses), release what they hold and exit (a call in flight
        releases its regions when it returns), and the process waits for that
        flush at exit (util/teardown.py's call_at_exit). The default waits
        unless this is a finalizer or one of our threads (util/teardown.py
        says why that must never wait).
        """
        try:
            if wait is None:
                wait = close_may_wait()
            if not wait:
                self._write_behind.abandon()  # goes on sending what is queued, for a bounded time
                # The prober's thread closes the pools and the metrics once that flush is over.
                self._link.abandon(self._write_behind.stopped, self._config.write_behind_close_timeout_ms / 1000)
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
