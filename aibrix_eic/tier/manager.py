"""`EICSecondaryTier`: EIC as a secondary tier of vLLM's own KV offloading
(`OffloadingConnector` with `spec_name: TieringOffloadingSpec`), loaded by
config alone:

    "secondary_tiers": [{"type": "EICSecondaryTier",
                         "module_path": "aibrix_eic.tier.manager", ...}]

vLLM hands the tier one memoryview over its CPU primary tier for the life of
the process; it is registered with the SDK once, here, and every transfer is
a batched mget/mset between EIC and slots of it (jobs.py). Every method runs
on vLLM's scheduler thread and returns without waiting on EIC: lookups are
answered from batched mexist rounds on vLLM's lookup thread (presence.py;
RETRY until the round answered), loads and stores are queued and reported
by get_finished_jobs. drain_jobs and shutdown wait, with a bound, for calls
already running; they never abandon one that may still touch the memoryview.

The interface is vLLM's `SecondaryTierManager` as in vLLM 0.32
(https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/kv_offload/tiering/base.py); docs/vllm.md#eic-as-a-secondary-tier.
"""

import logging
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from ..config import EICConfig
from ..keys.codec import KeyCodec, tier_codec
from ..keys.identity import announce, resolve_identity
from ..link.link import Link
from ..link.sdk import SdkBuffer, load_sdk_module
from ..observability.counters import Counters
from ..observability.logs import route_to_vllm
from ..observability.metrics import for_connector
from ..util.rate_limited_log import RateLimitedLogger
from .jobs import Finished, Transfers
from .presence import present
from .settings import describe_source, layout_text, tier_config

logger = logging.getLogger(__name__)

METRICS_CONN_ID = "vllm_tier"  # the `partition` label of the tier's aibrix_eic_* series
SHUTDOWN_WAIT_S = 10.0  # at most, for calls already running when vLLM shuts the tier down


class _Lookups(AsyncLookupManager):
    """vLLM's per-tier lookup state and thread; the batch is our mexist."""

    def __init__(self, tier: "EICSecondaryTier", tier_type: str) -> None:
        super().__init__(tier_type=tier_type)
        self._tier = tier

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.present(keys)


class EICSecondaryTier(SecondaryTierManager):
    medium: ClassVar[Medium | None] = Medium.CPU  # EIC holds KV in (remote) memory

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        locality: str | None = None,
        **entry: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        route_to_vllm()
        config = tier_config(entry, tier_type)  # ConfigError: vLLM does not start, with our message
        self._config = config
        self.locality = (
            Locality(locality) if locality else (Locality.LOCAL if config.uses_embedded_engine else Locality.REMOTE)
        )
        identity = resolve_identity(config.model_id)
        self._codec: KeyCodec = tier_codec(
            config.eic_kv_ns,
            identity.token,
            layout_text(offloading_spec.config, self.block_size_bytes, config.model_id),
        )
        self._counters = Counters(for_connector(config, METRICS_CONN_ID))
        self._link = Link(
            config, load_sdk_module(config), self._codec.prefix, self._counters, RateLimitedLogger(logger)
        )
        view = np.frombuffer(primary_kv_view, dtype=np.uint8)
        self._base = int(view.ctypes.data)
        self._link.register([(self._base, view.nbytes)], None)  # once: the view lives as long as the process
        status = self._link.open()
        if not status.is_ok():
            raise RuntimeError(f"EIC secondary tier: {status.message}")
        self._transfers = Transfers(self._link, config, self._counters)
        self._load_keys: dict[int, list[OffloadKey]] = {}
        self._lookups = _Lookups(self, tier_type)
        logger.info(
            "EIC secondary tier %r: remote_url=%s ns=%r config from %s; chunk %d bytes; %d bytes of the "
            "primary tier registered; keys %s",
            tier_type,
            config.remote_url,
            config.eic_kv_ns,
            describe_source(entry),
            self.block_size_bytes,
            view.nbytes,
            self._codec.prefix,
        )
        if identity.known:
            announce(identity, config)  # else the layout names the model: vLLM's model name and dtype

    # --------------------------------------------------------------- queries
    @property
    def config(self) -> EICConfig:
        return self._config

    @property
    def link(self) -> Link:
        return self._link

    @property
    def codec(self) -> KeyCodec:
        return self._codec

    def health(self) -> dict[str, Any]:
        """The tier's counters and breaker, as the connector's health() names them."""
        snapshot = self._link.breaker.snapshot()
        return {"breaker": snapshot.state.value, "in_flight_jobs": self._transfers.busy, **self._counters.snapshot()}

    def present(self, keys: list[OffloadKey]) -> list[bool]:
        """On vLLM's lookup thread: which keys EIC holds (presence.py)."""
        return present(self._link, self._config, self._counters, self._codec.encode_many(keys))

    # ------------------------------------------------------ vLLM's interface
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def _buffers(self, chunk_ids: Any, registered: bool) -> list[SdkBuffer]:
        size, base = self.block_size_bytes, self._base
        return [(base + int(chunk) * size, size, registered) for chunk in chunk_ids]

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        session = self._link.session
        registered = session is not None and session.registration_ok and self._config.put_registered
        self._transfers.submit(
            job_metadata.job_id, False, self._codec.encode_many(keys), self._buffers(job_metadata.chunk_ids, registered)
        )

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        session = self._link.session
        registered = session is not None and session.registration_ok
        self._load_keys[job_metadata.job_id] = keys
        self._transfers.submit(
            job_metadata.job_id, True, self._codec.encode_many(keys), self._buffers(job_metadata.chunk_ids, registered)
        )

    def get_finished_jobs(self) -> Iterable[JobResult]:
        return [self._result(done) for done in self._transfers.finished()]

    def _result(self, done: Finished) -> JobResult:
        successful_keys = None
        if done.is_load:
            keys = self._load_keys.pop(done.job_id)
            if not done.success:
                copied = set(done.loaded)
                # vLLM's lookup state said HIT for these: a miss now, or vLLM asks for them again and again
                self._lookups.mark_miss([key for i, key in enumerate(keys) if i not in copied])
                successful_keys = tuple(keys[i] for i in done.loaded) or None
        return JobResult(
            job_id=done.job_id,
            success=done.success,
            successful_keys=successful_keys,
            transfer_time=done.seconds,
            transfer_bytes=done.nbytes,
        )

    def has_pending_work(self) -> bool:
        return self._transfers.busy

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        """Wait for every running call (never abandoning one: it may still
        be copying into or out of the primary tier); queued calls past their
        deadline do not start. Bounded: past the longest a job can take
        (its deadline, then the calls already running), RuntimeError names
        the jobs, rather than return while they may touch vLLM's memory."""
        bound = self._drain_bound_s()
        left = self._transfers.wait_idle(bound)
        if left:
            raise RuntimeError(
                f"EIC secondary tier: transfer jobs {left} still running after {bound:g}s; "
                "their SDK calls have not returned"
            )

    def _drain_bound_s(self) -> float:
        return 2 * max(self._config.get_timeout_ms, self._config.put_timeout_ms) / 1000 + 1.0

    def shutdown(self) -> None:
        """Stop the lookup thread (its rounds end at exists_timeout_ms), wait
        at most SHUTDOWN_WAIT_S for calls already running, close the link.
        Calls still running then: RuntimeError, so vLLM keeps the primary
        tier's memory mapped (its TieringOffloadingManager.shutdown does so
        when a tier's shutdown fails)."""
        self._lookups.shutdown()
        left = self._transfers.wait_idle(min(SHUTDOWN_WAIT_S, self._drain_bound_s()))
        self._link.close()
        if left:
            raise RuntimeError(f"EIC secondary tier: transfer jobs {left} still running at shutdown")
