"""`aibrix-eic status`: what a running vLLM server's EIC connectors are
doing, read from its metrics (status_read.py), judged over a window between
two readings (status_judge.py: the states, the rates and the exit codes).
"""

import json
import time
from typing import Any, TextIO

from ..util.units import format_size
from .status_judge import UNREACHABLE, RankReport, Report, judge, unreachable
from .status_read import Scrape, Unreachable, read


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _per_second(rate: float | None) -> str:
    return "" if rate is None else f" ({rate:.2f}/s)"


def _rank_lines(rank: RankReport) -> list[str]:
    identity = rank.identity if rank.identity is not None else "?"
    lines = [
        f"rank {rank.partition}  ns={rank.eic_namespace!r} model={rank.model!r} identity={identity}  "
        f"{rank.state} (breaker trips {rank.breaker_trips:.0f})",
        f"  gets {rank.get_requests:.0f}{_per_second(rank.get_requests_per_s)}  hit rate {_percent(rank.hit_rate)} "
        f"({rank.hit_blocks:.0f} of {rank.get_blocks:.0f} blocks, {format_size(int(rank.bytes_loaded))}; "
        f"since start {_percent(rank.hit_rate_total)})",
        f"  requests {rank.requests:.0f}: errors {_percent(rank.error_rate)}, timeouts {_percent(rank.timeout_rate)}, "
        f"fast-failed {rank.fast_fails:.0f}, invalid {rank.invalid:.0f}",
    ]
    pending = rank.write_behind_pending_bytes
    lines.append(
        f"  write-behind: pending {'-' if pending is None else format_size(int(pending))}, "
        f"accepted {rank.write_behind_accepted:.0f}, lost {rank.write_behind_lost:.0f} "
        f"(since start {rank.write_behind_lost_total:.0f})"
    )
    if rank.store_capacity_bytes is not None:
        used = rank.store_used_bytes or 0.0
        lines.append(
            f"  embedded store: {format_size(int(used))} of {format_size(int(rank.store_capacity_bytes))} "
            f"({_percent(used / rank.store_capacity_bytes if rank.store_capacity_bytes else None)}), "
            f"evictions {rank.store_evictions or 0:.0f}"
        )
    return lines


def render(report: Report) -> str:
    window = "since start" if report.window_s is None else f"over {report.window_s:.1f} s"
    lines = [report.source if report.code == UNREACHABLE else f"{report.source}  (rates {window})"]
    if report.vllm_model is not None:
        line = f"vLLM model {report.vllm_model}"
        reused, queried = report.vllm_reused_tokens or 0.0, report.vllm_queried_tokens
        if queried is not None:
            hit_rate = reused / queried if queried else None
            line += f"; external prefix cache: {reused:.0f} of {queried:.0f} tokens reused ({_percent(hit_rate)})"
            if not reused and any(rank.hit_blocks for rank in report.ranks):
                # AIBrix's Type1 (and Type2, its subclass) tell vLLM's scheduler 0 matched tokens
                line += " (AIBrix's Type1 and Type2 load inside the model step: vLLM counts none of it)"
        lines.append(line)
    for rank in report.ranks:
        lines += _rank_lines(rank)
    lines.append(f"verdict: {report.verdict}")
    return "\n".join(lines)


def _emit(report: Report, out: TextIO, as_json: bool) -> None:
    if as_json:
        out.write(json.dumps(report.as_json()) + "\n")
    else:
        out.write(render(report) + "\n")
    out.flush()


def _reading(source: dict[str, str], timeout_s: float) -> Scrape | Report:
    try:
        return read(source, timeout_s)
    except Unreachable as e:
        return unreachable(next(iter(source.values())), str(e))


def run_status(args: Any, out: TextIO) -> int:
    """One report (rates over --interval), or one per --watch period
    (rates since the last reading) until --count reports or Ctrl-C."""
    source = {"directory": args.multiproc_dir} if args.multiproc_dir else {"url": args.url}
    sleep = time.sleep
    before = None
    if args.watch is None and args.interval > 0:
        first = _reading(source, args.timeout)
        if isinstance(first, Report):
            _emit(first, out, args.json)
            return UNREACHABLE
        before = first
        sleep(args.interval)
    reports = 0
    code = UNREACHABLE
    try:
        while True:
            now = _reading(source, args.timeout)
            report = now if isinstance(now, Report) else judge(now, before)
            _emit(report, out, args.json)
            code = report.code
            reports += 1
            if args.watch is None or (args.count is not None and reports >= args.count):
                return code
            before = now if isinstance(now, Scrape) else None
            sleep(args.watch)
    except KeyboardInterrupt:
        return code
