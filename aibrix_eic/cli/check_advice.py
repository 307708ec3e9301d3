"""What `aibrix-eic check` tells an operator to do about a failure: advice
matched on the failure's message, for the failures an operator can fix."""

from ..config import EICConfig
from ..util.docs import docs_url


def what_to_fix(message: str, config: EICConfig | None) -> str:
    """Advice for the failures an operator can fix, from a failure's message."""
    embedded = config is not None and config.uses_embedded_engine
    endpoint = config.endpoint if config is not None else "?"
    lowered = message.lower()
    if "needs the eic python sdk" in lowered:
        return "install the SDK wheel named above, or use remote_url: local://"
    if embedded and "shared store" in lowered:  # the engine's message says the cause and the fix itself
        return "do what the message says after the cause, or drop dir= from remote_url for a store in this process"
    if "unreachable" in lowered or "init returned -1" in lowered:
        if embedded:
            return "remote_url asks the embedded engine to act unreachable (unreachable=true); remove that"
        return (
            f"check that {endpoint} is reachable from this host (network path, security group), that the "
            "EIC agent on this node is running, and that eic_instance_id is this cluster's id"
        )
    if "init returned" in lowered or "client setup raised" in lowered:
        return "EIC refused the client: check eic_instance_id, eic_trans_type and eic_flag_file"
    if "eic config" in lowered:
        return f"fix the config file ({docs_url('config.md')} lists every key)"
    if "namespace_not_found" in lowered:
        return f"namespace {config.eic_kv_ns if config else ''!r} does not exist on this EIC: create it or change eic_kv_ns"
    if "memory_not_registered" in lowered:
        return "EIC did not accept the registered buffer: check register_memory in the SDK logs (eic_log_dir)"
    if "value_too_large" in lowered or "max_value_bytes" in lowered:
        return "blocks are bigger than EIC accepts: use a smaller block size or raise the cluster's value limit"
    if "out_of_capacity" in lowered:
        return "EIC is full and could not evict: raise its capacity"
    if "timeout" in lowered:
        return "EIC answered too slowly: check the network, or raise get/put/exists_timeout_ms in the config"
    if "failed" in lowered and ("mset" in lowered or "mget" in lowered or "mexist" in lowered or "mdel" in lowered):
        if embedded:
            return "the embedded engine injects failures (fail_rate/key_fail_rate in remote_url); remove them"
        return "EIC answers but fails the calls: see the SDK logs in eic_log_dir and the cluster's health"
    return ""


# AIBrix's names for the settings the ingestion step reads.
L1_ENABLED = "AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED"
INGESTION_TYPE = "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE"
MAX_INFLIGHT_TOKENS = "AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS"


def ingestion_advice(put_mode: str, batched: bool = False) -> str:
    """What to change when AIBrix, as configured in this environment, would
    write L2 synchronously behind L1 with a put that waits for EIC: the
    blocks L1 ingests then wait for EIC round trips inside the engine's put
    or acquire (with HOT, the default, inside the reload): one per L1 call
    with batched ingestion (aibrix_compat/ingestion.py), one per block
    without. Empty otherwise: with put_mode write_behind a put returns at
    once, and asynchronous ingestion gained it 1.0-2.0x against 1.9-7.7x for
    direct (docs/performance.md)."""
    from aibrix_kvcache import envs

    if (
        not envs.AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED
        or envs.AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS > 0
    ):
        return ""
    if put_mode == "write_behind":
        return ""
    batched = batched and envs.AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE != "EVICTED"  # never batched
    per = "every L1 acquire or put that ingests blocks" if batched else "every block L1 ingests"
    return (
        f"{L1_ENABLED} is on, {MAX_INFLIGHT_TOKENS}=0 and put_mode is {put_mode}: {per} "
        f"({INGESTION_TYPE}={envs.AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_TYPE}) waits for an EIC round trip inside "
        f"the request ({docs_url('vllm.md', 'l1-on-synchronous-ingestion')}); use put_mode write_behind, or set "
        f"{MAX_INFLIGHT_TOKENS} to at least 2x vLLM's max_num_batched_tokens (that many tokens of extra host "
        "memory) for asynchronous ingestion"
    )


def ingestion_is_fine(put_mode: str) -> str:
    """Which of the conditions that keep EIC out of the request holds (the
    first, when several do): the ingestion step's PASS detail."""
    from aibrix_kvcache import envs

    if not envs.AIBRIX_KV_CACHE_OL_L1_CACHE_ENABLED:
        return f"L1 is off ({L1_ENABLED}): nothing is ingested behind it"
    inflight = envs.AIBRIX_KV_CACHE_OL_L2_CACHE_INGESTION_MAX_INFLIGHT_TOKENS
    if inflight > 0:
        return f"L1 ingestion is asynchronous ({MAX_INFLIGHT_TOKENS}={inflight})"
    return f"L1 ingestion is synchronous, but put_mode is {put_mode}: a put returns at once"
