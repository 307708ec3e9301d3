"""Turns the bench's per-request timings into a summary: a JSON-ready dict
(`--json`) and the text a person reads. GB means 1e9 bytes."""

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..util.units import format_size
from .driver import OPS, RequestResult
from .shapes import ModelShape

GB = 1e9
MAX_ERRORS_SHOWN = 5


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else 0.0


def _latency(samples: Sequence[float]) -> dict[str, float]:
    if not samples:
        return {"count": 0, "p50": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}
    ms = np.asarray(samples) * 1000
    return {
        "count": len(samples),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "mean": float(ms.mean()),
        "max": float(ms.max()),
    }


def summarize(
    shape: ModelShape,
    results: Sequence[RequestResult],
    backend: dict[str, Any],
    connector_health: dict[str, Any] | None,
    elapsed_s: float,
    seed: int,
) -> dict[str, Any]:
    """The bench's results; warm-up requests are reported but not counted."""
    timed = [r for r in results if not r.warmup]
    bytes_per_token = shape.bytes_per_token
    tokens = timed[0].tokens if timed else (results[0].tokens if results else 0)
    offered = sum(r.tokens for r in timed)
    offloaded = sum(r.offloaded_tokens for r in timed)
    looked_up = sum(r.looked_up_tokens for r in timed)
    reloaded = sum(r.reloaded_tokens for r in timed)

    def seconds(op: str) -> float:
        return sum(r.seconds.get(op, 0.0) for r in timed)

    def throughput(nbytes: int, secs: float) -> dict[str, float]:
        return {"bytes": nbytes, "seconds": secs, "gb_per_s": _rate(nbytes, secs)}

    errors = [error for r in timed for error in r.errors]
    return {
        "model": shape.as_dict(),
        "workload": {
            "requests": len(timed),
            "warmup_requests": sum(1 for r in results if r.warmup),
            "tokens_per_request": tokens,
            "blocks_per_request": tokens // shape.block_ntokens,
            "bytes_per_request": tokens * bytes_per_token,
            "seed": seed,
        },
        "backend": backend,
        "bytes_per_token": bytes_per_token,
        "offload": throughput(offloaded * bytes_per_token, seconds("put") + seconds("flush")),
        "reload": throughput(reloaded * bytes_per_token, seconds("acquire")),
        "send_path": throughput(offloaded * bytes_per_token, sum(r.send_seconds for r in timed)),
        "receive_path": throughput(reloaded * bytes_per_token, sum(r.receive_seconds for r in timed)),
        "latency_ms": {op: _latency([r.seconds[op] for r in timed if op in r.seconds]) for op in OPS},
        "hit_rate": reloaded / offered if offered else 0.0,
        "lookup_hit_rate": looked_up / offered if offered else 0.0,
        "tokens": {"offered": offered, "offloaded": offloaded, "looked_up": looked_up, "reloaded": reloaded},
        "verified_bytes": reloaded * bytes_per_token,
        "mismatched_blocks": sum(r.mismatched_blocks for r in timed),
        "error_count": len(errors),
        "errors": errors[:MAX_ERRORS_SHOWN],
        "per_request": [
            {
                "index": r.index,
                "warmup": r.warmup,
                "put_s": r.seconds.get("put", 0.0),
                "flush_s": r.seconds.get("flush", 0.0),
                "acquire_s": r.seconds.get("acquire", 0.0),
                "offload_gb_per_s": _rate(r.offloaded_tokens * bytes_per_token, r.offload_seconds),
                "reload_gb_per_s": _rate(r.reloaded_tokens * bytes_per_token, r.seconds.get("acquire", 0.0)),
            }
            for r in results
        ],
        "connector_health": connector_health or {},
        "elapsed_s": elapsed_s,
    }


STORE_MODES = {
    "eic": "an EIC cluster",
    "in-process": "the embedded engine, in-process: this process alone sees the blocks",
    "shared": "the embedded engine, shared: a store in {dir} that every process opening it sees",
}


def render_text(summary: dict[str, Any]) -> str:
    model, work, backend = summary["model"], summary["workload"], summary["backend"]
    latency = summary["latency_ms"]

    def lat(op: str) -> str:
        return f"p50 {latency[op]['p50']:8.2f} ms   p99 {latency[op]['p99']:8.2f} ms"

    tokens = summary["tokens"]
    lines = [
        f"model     {model['name']}: {model['description']}",
        f"          {format_size(model['bytes_per_token'])}/token, {format_size(model['block_nbytes'])}/block "
        f"({model['block_ntokens']} tokens, {model['dtype']}, LCND)",
        f"backend   {backend['remote_url']} via {backend['manager']} -> {backend['connector']}",
        f"store     {STORE_MODES[backend['store_mode']].format(dir=backend['store_dir'])}",
        f"workload  {work['requests']} requests x {work['tokens_per_request']} tokens "
        f"({work['blocks_per_request']} blocks, {format_size(work['bytes_per_request'])} each), "
        f"{work['warmup_requests']} warm-up",
        "",
        f"offload   {summary['offload']['gb_per_s']:7.2f} GB/s   put      {lat('put')}",
        f"          (put + flush)  flush    {lat('flush')}",
        f"reload    {summary['reload']['gb_per_s']:7.2f} GB/s   acquire  {lat('acquire')}",
        f"lookup                    exists   {lat('lookup')}",
        f"send path {summary['send_path']['gb_per_s']:7.2f} GB/s   (exists + allocate + copy-in + put)",
        f"recv path {summary['receive_path']['gb_per_s']:7.2f} GB/s   (exists + acquire + verify + release)",
        "",
        f"hit rate  {summary['hit_rate'] * 100:.1f}% ({tokens['reloaded']}/{tokens['offered']} tokens reloaded; "
        f"lookup saw {summary['lookup_hit_rate'] * 100:.1f}%)",
        f"verified  {format_size(summary['verified_bytes'])}, {summary['mismatched_blocks']} mismatched blocks",
    ]
    if summary["error_count"]:
        lines.append(f"errors    {summary['error_count']}, first: {summary['errors'][0]}")
    return "\n".join(lines)
