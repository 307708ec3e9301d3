"""Turns the bench's per-request timings into a summary: a JSON-ready dict
(`--json`) and the text a person reads. GB means 1e9 bytes."""

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..util.units import format_size
from .driver import OPS, RequestResult
from .shapes import ModelShape
from .verdict import judge, noise, ratios

GB = 1e9
MAX_ERRORS_SHOWN = 5
# Fewer samples than this and a p99 is only the maximum under another name.
P99_MIN_SAMPLES = 100
OFFLOAD_LABEL = "offload (put + flush)"
RELOAD_LABEL = "reload (acquire)"


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else 0.0


def _latency(samples: Sequence[float]) -> dict[str, float | None]:
    """p50, mean and max of the per-call times; p99 only from
    P99_MIN_SAMPLES samples on (null below that)."""
    if not samples:
        return {"count": 0, "p50": 0.0, "p99": None, "mean": 0.0, "max": 0.0}
    ms = np.asarray(samples) * 1000
    return {
        "count": len(samples),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)) if len(samples) >= P99_MIN_SAMPLES else None,
        "mean": float(ms.mean()),
        "max": float(ms.max()),
    }


def _moved(result: RequestResult, bytes_per_token: int) -> dict[str, tuple[int, float]]:
    """(bytes, seconds) of one request, per direction: offload is put +
    flush (until the blocks are in EIC), reload is acquire."""
    return {
        "offload": (result.offloaded_tokens * bytes_per_token, result.offload_seconds),
        "reload": (result.reloaded_tokens * bytes_per_token, result.seconds.get("acquire", 0.0)),
    }


def run_rates(results: Sequence[RequestResult], bytes_per_token: int) -> dict[str, dict[str, Any]]:
    """The one computation behind every rate the bench prints, ours and the
    MOCK floor's alike: per direction, the timed requests' bytes over their
    time, and each request's own rate."""
    timed = [_moved(r, bytes_per_token) for r in results if not r.warmup]
    rates = {}
    for direction in ("offload", "reload"):
        nbytes = sum(moved[direction][0] for moved in timed)
        seconds = sum(moved[direction][1] for moved in timed)
        rates[direction] = {
            "bytes": nbytes,
            "seconds": seconds,
            "gb_per_s": _rate(nbytes, seconds),
            "per_request": [_rate(*moved[direction]) for moved in timed],
        }
    return rates


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

    def throughput(nbytes: int, secs: float) -> dict[str, float]:
        return {"bytes": nbytes, "seconds": secs, "gb_per_s": _rate(nbytes, secs)}

    errors = [error for r in timed for error in r.errors]
    rates = run_rates(results, bytes_per_token)
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
        "offload": {k: v for k, v in rates["offload"].items() if k != "per_request"},
        "reload": {k: v for k, v in rates["reload"].items() if k != "per_request"},
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
                "offload_gb_per_s": _rate(*_moved(r, bytes_per_token)["offload"]),
                "reload_gb_per_s": _rate(*_moved(r, bytes_per_token)["reload"]),
            }
            for r in results
        ],
        "noise": noise(
            {d: rates[d]["per_request"] for d in ("offload", "reload")},
            {d: rates[d]["gb_per_s"] for d in ("offload", "reload")},
        ),
        "connector_health": connector_health or {},
        "elapsed_s": elapsed_s,
    }


def add_baselines(summary: dict[str, Any], floor: Sequence[RequestResult], memcpy_seconds: Sequence[float]) -> None:
    """The same-run baselines and the verdict against them (verdict.py),
    every rate from run_rates, ours included, so the ratios are the printed
    rates' quotients."""
    bytes_per_token = summary["bytes_per_token"]
    request_nbytes = summary["workload"]["bytes_per_request"]
    timed = [r for r in floor if not r.warmup]
    mock = run_rates(floor, bytes_per_token)
    memcpy_rate = _rate(len(memcpy_seconds) * request_nbytes, sum(memcpy_seconds))
    summary["baseline"] = {
        "mock": {
            "offload_gb_per_s": mock["offload"]["gb_per_s"],
            "reload_gb_per_s": mock["reload"]["gb_per_s"],
            "per_request": [
                {"index": r.index, "offload_gb_per_s": o, "reload_gb_per_s": g}
                for r, o, g in zip(timed, mock["offload"]["per_request"], mock["reload"]["per_request"])
            ],
            "mismatched_blocks": sum(r.mismatched_blocks for r in timed),
            "errors": [e for r in timed for e in r.errors][:MAX_ERRORS_SHOWN],
        },
        "memcpy": {"gb_per_s": memcpy_rate, "per_request": [_rate(request_nbytes, s) for s in memcpy_seconds]},
    }
    ours = {d: [r[f"{d}_gb_per_s"] for r in summary["per_request"] if not r["warmup"]] for d in ("offload", "reload")}
    summary["verdict"] = judge(
        {d: summary[d]["gb_per_s"] for d in ("offload", "reload")},
        {d: mock[d]["gb_per_s"] for d in ("offload", "reload")},
        memcpy_rate,
        {d: ratios(ours[d], mock[d]["per_request"]) for d in ("offload", "reload")},
    )


STORE_MODES = {
    "eic": "an EIC cluster",
    "in-process": "the embedded engine, in-process: this process alone sees the blocks",
    "shared": "the embedded engine, shared: a store in {dir} that every process opening it sees",
}


def render_text(summary: dict[str, Any]) -> str:
    model, work, backend = summary["model"], summary["workload"], summary["backend"]
    latency = summary["latency_ms"]
    few = any(stats["count"] and stats["p99"] is None for stats in latency.values())

    def lat(op: str) -> str:
        stats = latency[op]
        tail = f"p99 {stats['p99']:8.2f} ms" if stats["p99"] is not None else f"max {stats['max']:8.2f} ms"
        return f"p50 {stats['p50']:8.2f} ms   {tail}"

    tokens = summary["tokens"]
    lines = [
        f"model     {model['name']}: {model['description']}",
        f"          {format_size(model['bytes_per_token'])}/token, {format_size(model['block_nbytes'])}/block "
        f"({model['block_ntokens']} tokens, {model['dtype']}, LCND)",
        f"backend   {backend['remote_url']} via {backend['manager']} -> {backend['connector']}",
        f"store     {STORE_MODES[backend['store_mode']].format(dir=backend['store_dir'])}",
    ]
    if backend.get("store_after_run"):
        lines.append(f"          {backend['store_after_run']}")
    lines += [
        f"workload  {work['requests']} requests x {work['tokens_per_request']} tokens "
        f"({work['blocks_per_request']} blocks, {format_size(work['bytes_per_request'])} each), "
        f"{work['warmup_requests']} warm-up",
        "",
        f"offload   {summary['offload']['gb_per_s']:7.2f} GB/s   put      {lat('put')}",
        f"          (put + flush)  flush    {lat('flush')}",
        f"reload    {summary['reload']['gb_per_s']:7.2f} GB/s   acquire  {lat('acquire')}",
        f"lookups                   exists   {lat('exists')}   (send turn: a new prompt)",
        f"                          lookup   {lat('lookup')}   (receive turn: exists on the sent prompt)",
        f"send path {summary['send_path']['gb_per_s']:7.2f} GB/s   (exists + allocate + copy-in + put)",
        f"recv path {summary['receive_path']['gb_per_s']:7.2f} GB/s   (exists + acquire + verify + release)",
    ]
    if few:
        lines.append(
            f"          latencies: p50 and max of one call per request (p99 from {P99_MIN_SAMPLES} requests on)"
        )
    lines += _write_behind_lines(summary)
    lines += [
        "",
        f"hit rate  {summary['hit_rate'] * 100:.1f}% ({tokens['reloaded']}/{tokens['offered']} tokens reloaded; "
        f"lookup saw {summary['lookup_hit_rate'] * 100:.1f}%)",
        f"verified  {format_size(summary['verified_bytes'])}, {summary['mismatched_blocks']} mismatched blocks",
    ]
    if summary["error_count"]:
        lines.append(f"errors    {summary['error_count']}, first: {summary['errors'][0]}")
    lines += _verdict_lines(summary)
    return "\n".join(lines)


def _write_behind_lines(summary: dict[str, Any]) -> list[str]:
    wb = summary.get("write_behind")
    if wb is None:
        return []
    head = f"write-behind {wb['blocks']}/{wb['of_blocks']} put blocks (put_mode {wb['put_mode']})"
    if wb["put_mode"] == "write_behind" and not wb["engaged"]:
        head = f"write-behind NOT ENGAGED: 0/{wb['of_blocks']} put blocks (put_mode {wb['put_mode']})"
    return [head, f"          {wb['why']}"]


def _verdict_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    baseline, verdict = summary.get("baseline"), summary.get("verdict")
    if baseline is not None and verdict is not None:
        mock = baseline["mock"]
        lines += [
            "",
            f"baseline  same run, same bytes: AIBrix MOCK backend offload {mock['offload_gb_per_s']:.2f} GB/s, "
            f"reload {mock['reload_gb_per_s']:.2f} GB/s; memcpy {baseline['memcpy']['gb_per_s']:.2f} GB/s",
        ]
        for direction in ("offload", "reload"):
            v = verdict[direction]
            rounds = v["rounds"]
            lines.append(
                f"verdict   {direction} {summary[direction]['gb_per_s']:.2f} / {mock[f'{direction}_gb_per_s']:.2f} "
                f"GB/s = {v['vs_mock']:.2f}x of the MOCK floor: {v['grade']} "
                f"(rounds {rounds['min']:.2f}-{rounds['max']:.2f}x; {v['vs_memcpy']:.2f}x memcpy)"
            )
        t = verdict["thresholds"]
        lines.append(
            f"          good >= {t['good']}x of the floor, fair >= {t['fair']}x, else slow "
            "(each rate: the run's bytes over its time)"
        )
        if mock["mismatched_blocks"] or mock["errors"]:
            lines.append(f"          the MOCK floor went wrong too: {mock['errors'][:1] or 'mismatched blocks'}")
    note = summary["noise"]["note"]
    if note:
        lines += ["", f"noise     {note}"]
    return lines
