"""`EICPDReuseConnector`: AIBrix's `AIBrixPDReuseConnector` (aibrix-kvcache
0.8.0) for disaggregated prefill/decode through EIC, with the decoder's
failed loads reported to vLLM.

A decoder request (`do_remote_prefill`) waits until the connector says its
prompt's KV was received, then vLLM decodes from those blocks. AIBrix's
worker marks the request received before it loads, stops at the first chunk
the L2 does not have, and reports no failure: vLLM then decodes from blocks
nothing wrote (wrong tokens, no error). Here the worker reports the blocks
its load left unwritten (`get_block_ids_with_load_errors`), so vLLM keeps
the loaded prefix and recomputes the rest (with `kv_load_failure_policy:
recompute`; vLLM's default `fail` ends the request with an error instead),
and the scheduler answers 0 external tokens when vLLM asks again, so a
prompt gone from EIC is computed, not looked for forever.

The prefiller side is AIBrix's: it writes the prompt through the L2 and
calls the cache manager's flush(), which waits for our accepted writes
(aibrix_compat/flush.py), before its response sends the decoder to read.

Two more fixes of AIBrix's: a prompt's partial last block is keyed with
padding no token id takes (padding.py), so no key names KV its block does
not hold; and a decoder request vLLM preempted is not loaded again once it
runs (AIBrix marks every resumed one for a load, whose "received" report
for a running request kills vLLM's engine): vLLM's own resume loads it once.

Pass it to vLLM as
`{"kv_connector":"EICPDReuseConnector","kv_connector_module_path":"aibrix_eic.pd.connector", ...}`.
"""

import logging
from typing import Any, cast

from aibrix_kvcache.integration.vllm.kv_connector.aibrix_pd_reuse_connector import (
    AIBrixPDReuseConnector,
    AIBrixPDReuseConnectorScheduler,
    AIBrixPDReuseConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from ..observability.logs import route_to_vllm
from ..util.rate_limited_log import RateLimitedLogger
from .loads import HandOffs, unloaded_block_ids
from .padding import fill_padding

logger = logging.getLogger(__name__)
_rate_log = RateLimitedLogger(logger)

RECOMPUTE = "recompute"


class EICPDReuseScheduler(AIBrixPDReuseConnectorScheduler):
    """AIBrix's scheduler side; a decoder request whose load failed is not
    loaded again, nor one that vLLM runs."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._extend()

    @classmethod
    def adopt(cls, scheduler: AIBrixPDReuseConnectorScheduler) -> "EICPDReuseScheduler":
        """The scheduler AIBrix's connector __init__ built, made ours."""
        scheduler.__class__ = cls
        ours = cast(EICPDReuseScheduler, scheduler)
        ours._extend()
        return ours

    def _extend(self) -> None:
        self.hand_offs = HandOffs()

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        if self.hand_offs.failed(request.request_id):
            return 0, False  # its prompt is not in EIC: vLLM computes it
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill") and num_external_tokens > 0:
            self.hand_offs.started(request.request_id, blocks.get_block_ids()[0])

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = super().build_connector_meta(scheduler_output)
        # vLLM waits for a decoder load only while the request is
        # WAITING_FOR_REMOTE_KVS, never scheduled; a load of a request it
        # schedules (AIBrix marks each resumed one) would be reported
        # received while it runs, which vLLM's scheduler asserts against.
        running = scheduler_output.num_scheduled_tokens
        for req_id in [r for r, m in meta.items() if m.do_remote_prefill and r in running]:
            meta.requests.pop(req_id)
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.hand_offs.finished(request.request_id)
        return super().request_finished(request, block_ids)


class EICPDReuseWorker(AIBrixPDReuseConnectorWorker):
    """AIBrix's worker side; a decoder load that fell short names the blocks
    it left unwritten, and a partial last block is keyed by its real tokens."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._extend()

    @classmethod
    def adopt(cls, worker: AIBrixPDReuseConnectorWorker) -> "EICPDReuseWorker":
        """The worker AIBrix's connector __init__ built (its cache manager
        open), made ours: one cache manager per worker."""
        worker.__class__ = cls
        ours = cast(EICPDReuseWorker, worker)
        ours._extend()
        return ours

    def _extend(self) -> None:
        self.unloaded: set[int] = set()  # engine block ids, until vLLM collects them
        for needed in ("_received_requests", "_meta_cache", "engine_block_ntokens"):
            if not hasattr(self, needed):
                raise RuntimeError(
                    f"EICPDReuseConnector: AIBrix's PD worker has no {needed}; "
                    "this connector is built for aibrix-kvcache 0.8.0"
                )

    def _update_meta_cache(self, metadata: Any) -> None:
        super()._update_meta_cache(metadata)
        for req_id in metadata.requests:
            cached = self._meta_cache.get(req_id)
            if cached is not None and cached.enable_padding and fill_padding(cached.context_tokens, cached.prompt_len):
                cached.context_tokens_view = None  # built on the old ids; the next read keys the new ones

    def _recv_kv_from_cache_impl(self, seq_request_meta: Any) -> int:
        if not seq_request_meta.do_remote_prefill:
            return super()._recv_kv_from_cache_impl(seq_request_meta)
        req_id = seq_request_meta.req_id
        try:
            loaded = super()._recv_kv_from_cache_impl(seq_request_meta)
        except Exception as e:  # the blocks it was writing are as good as unwritten
            _rate_log.log("load-error", logging.ERROR, "EIC PD: loading a prompt's KV raised: %r", e)
            loaded = 0
        self._received_requests.add(req_id)  # AIBrix adds it before loading; vLLM waits for it either way
        prompt_len = seq_request_meta.prompt_len
        loaded_until = seq_request_meta.context_len + loaded
        if loaded_until >= prompt_len:
            return loaded
        slots = self._meta_cache[req_id].context_slot_mapping[:prompt_len].tolist()
        missing = unloaded_block_ids(slots, loaded_until, prompt_len, self.engine_block_ntokens)
        self.unloaded |= missing
        _rate_log.log(
            "short-load",
            logging.WARNING,
            "EIC PD: request %s loaded %d of %d prompt tokens from EIC; vLLM recomputes the other %d (%d blocks)",
            req_id,
            loaded_until,
            prompt_len,
            prompt_len - loaded_until,
            len(missing),
        )
        return loaded

    def take_unloaded(self) -> set[int]:
        unloaded, self.unloaded = self.unloaded, set()
        return unloaded


class EICPDReuseConnector(AIBrixPDReuseConnector):
    """AIBrix's PD reuse connector whose decoder never decodes from KV it did not load."""

    connector_scheduler: EICPDReuseScheduler | None
    connector_worker: EICPDReuseWorker | None

    def __init__(self, config: Any, role: Any, kv_cache_config: Any = None) -> None:
        route_to_vllm()
        # AIBrix's __init__ builds its scheduler or worker (the worker opens
        # the cache manager); we make that object ours rather than build a second.
        super().__init__(config, role, kv_cache_config)
        if self.connector_scheduler is not None:
            self.connector_scheduler = EICPDReuseScheduler.adopt(self.connector_scheduler)
            _say_failure_policy(config)
        if self.connector_worker is not None:
            self.connector_worker = EICPDReuseWorker.adopt(self.connector_worker)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.connector_worker.take_unloaded() if self.connector_worker is not None else set()

    def update_connector_output(self, connector_output: Any) -> None:
        super().update_connector_output(connector_output)
        if self.connector_scheduler is None:
            return
        invalid = getattr(connector_output, "invalid_block_ids", None) or ()  # absent before vLLM 0.11
        hand_offs = self.connector_scheduler.hand_offs
        failed = hand_offs.invalid(set(invalid))
        hand_offs.received(connector_output.finished_recving or ())  # its blocks are the request's now
        if failed:
            _rate_log.log(
                "recompute",
                logging.WARNING,
                "EIC PD: %d decoder request(s) could not load their prompt's KV from EIC; computing them here",
                len(failed),
            )


def _say_failure_policy(config: Any) -> None:
    policy = getattr(config.kv_transfer_config, "kv_load_failure_policy", RECOMPUTE)
    if policy == RECOMPUTE:
        logger.info("EIC PD: a decoder request whose prompt KV is not in EIC is recomputed")
    else:
        logger.warning(
            'EIC PD: kv_load_failure_policy is %r: a decoder request whose prompt KV is not in EIC fails; add "kv_load_failure_policy":"recompute" to --kv-transfer-config to compute it instead',
            policy,
        )
