"""`aibrix-eic bench`: offload and reload KV blocks through AIBrix's
BaseKVCacheManager on backend EIC, verify every byte, report GB/s, per-call
latency and the hit rate, and judge them against baselines measured in the
same run (AIBrix's MOCK backend, memcpy). Without a config it runs on the
embedded engine.

Exit status: 0 on a clean run; 1 when the manager cannot be built, EIC is
unavailable, nothing was reloaded, or a reloaded byte differs.
"""

import argparse
import contextlib
import json
import time
import warnings
from typing import Any, TextIO

from ..config import ENV_CONFIG, ConfigError, EICConfig
from ..util.docs import docs_url
from .baseline import MemcpyBaseline
from .driver import EMBEDDED_STORE, ManagerDriver, ManagerUnavailable, RequestResult
from .progress import ProgressBar
from .report import add_baselines, render_text, summarize
from .runtime import scoped_env
from .shapes import SHAPES
from .shared_dir import BenchStore
from .verdict import write_behind


def run_bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    shape = SHAPES[args.model]
    if args.plot:
        from .plot import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()
        except PlotUnavailable as e:
            print(f"aibrix-eic bench: {e}", file=err)
            return 2
    if args.config and args.shared_dir:
        print(
            "aibrix-eic bench: --shared-dir is for the engine config bench writes itself; "
            "with --config, put ?dir=DIR in its remote_url instead",
            file=err,
        )
        return 2
    env = {ENV_CONFIG: args.config} if args.config else {}
    with scoped_env(env):
        try:
            EICConfig.from_env()  # the connector validates it again; this fails before any setup
        except ConfigError as e:
            print(f"aibrix-eic bench: {e}", file=err)
            print(f"{docs_url('config.md')} lists every key; `aibrix-eic check` runs the same validation", file=err)
            return 1
        try:
            driver = ManagerDriver(shape, args.tokens, seed=args.seed, shared_dir=args.shared_dir)
        except ValueError as e:
            print(f"aibrix-eic bench: {e}", file=err)
            return 2
        if driver.tokens != args.tokens:
            print(
                f"aibrix-eic bench: --tokens {args.tokens} rounded down to {driver.tokens} "
                f"(whole blocks of {shape.block_ntokens})",
                file=err,
            )
        return _run(driver, args, out, err)


def _run(driver: ManagerDriver, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    started = time.perf_counter()
    store = BenchStore(args.shared_dir, EMBEDDED_STORE, keep=args.keep) if args.shared_dir else None
    planned = args.warmup + args.requests
    try:
        with contextlib.ExitStack() as stack:
            if store is not None:
                store.prepare()
                stack.callback(store.cleanup)  # after the manager closed (exits run last-in first-out)
            stack.enter_context(driver.opened(planned))
            connector = driver.connector
            breaker = getattr(connector, "breaker", None)
            if breaker is not None and breaker.tripped:
                reason = connector.health().get("breaker_reason", "")
                print(f"aibrix-eic bench: EIC is unavailable ({reason})", file=err)
                print("run `aibrix-eic check` (with the same --config) for a diagnosis", file=err)
                return 1
            baselines = None
            if not args.no_baseline:
                floor = ManagerDriver(driver.shape, driver.tokens, seed=args.seed, mock=True)
                stack.enter_context(floor.opened(planned))
                baselines = Baselines(floor, MemcpyBaseline(driver.nblocks, driver.block_nbytes))
            progress = ProgressBar(planned, err, enabled=False if args.no_progress else None)
            results = _drive(driver, baselines, args.warmup, args.requests, progress)
            health = connector.health() if hasattr(connector, "health") else None
            backend = _backend_info(driver, connector)
            put_limit = _write_behind_limit(driver, connector)
    except ManagerUnavailable as e:
        print(f"aibrix-eic bench: AIBrix could not build its cache manager: {e}", file=err)
        print("run `aibrix-eic check` (with the same --config) for a diagnosis", file=err)
        return 1

    summary = summarize(
        shape=driver.shape,
        results=results,
        backend=backend,
        connector_health=health,
        elapsed_s=time.perf_counter() - started,
        seed=args.seed,
    )
    if baselines is not None:
        add_baselines(summary, baselines.floor_results, baselines.memcpy_seconds)
    if health is not None and put_limit is not None:
        summary["write_behind"] = write_behind(health, put_limit[0], driver.request_nbytes, put_limit[1])
    if store is not None:
        summary["backend"]["store_after_run"] = store.outcome()
    if args.json:
        print(json.dumps(summary, indent=2), file=out)
    else:
        print(render_text(summary), file=out)
    if args.plot:
        from .plot import PlotUnavailable, draw

        try:
            draw(summary, args.plot)
        except PlotUnavailable as e:
            print(f"aibrix-eic bench: {e}", file=err)
            return 1
        if not args.json:
            print(f"plot      {args.plot}", file=out)
    return _exit_status(summary, err)


class Baselines:
    """The same-run baselines (baseline.py): AIBrix's MOCK floor and memcpy,
    one round of each after each of our requests."""

    def __init__(self, floor: ManagerDriver, memcpy: MemcpyBaseline) -> None:
        self.floor = floor
        self.memcpy = memcpy
        self.floor_results: list[RequestResult] = []
        self.memcpy_seconds: list[float] = []

    def run_round(self, index: int, warmup: bool) -> None:
        with warnings.catch_warnings():
            # AIBrix's MOCK get wraps read-only bytes in a tensor and torch warns about it.
            warnings.simplefilter("ignore", UserWarning)
            self.floor_results.append(self.floor.run_request(index, warmup=warmup))
        self.floor.forget(index)
        seconds = self.memcpy.run_round()
        if not warmup:
            self.memcpy_seconds.append(seconds)


def _drive(
    driver: ManagerDriver, baselines: Baselines | None, warmup: int, requests: int, progress: ProgressBar
) -> list[RequestResult]:
    results: list[RequestResult] = []
    offloaded_bytes = 0
    put_seconds = 0.0
    try:
        for index in range(warmup + requests):
            is_warmup = index < warmup
            result = driver.run_request(index, warmup=is_warmup)
            results.append(result)
            if baselines is not None:
                baselines.run_round(index, is_warmup)
            if is_warmup:
                note = f"warm-up {index + 1}/{warmup}"
            else:
                offloaded_bytes += result.offloaded_tokens * driver.shape.bytes_per_token
                put_seconds += result.offload_seconds
                rate = offloaded_bytes / put_seconds / 1e9 if put_seconds else 0.0
                note = f"offload {rate:.2f} GB/s"
            progress.update(index + 1, note)
    finally:
        progress.close()
    return results


def _write_behind_limit(driver: ManagerDriver, connector: Any) -> tuple[str, int] | None:
    """Our connector's put_mode and the bytes write-behind holds at most:
    write_behind_max_bytes, or a share of the slabs registered with it."""
    config = getattr(connector, "config", None)
    if config is None or not hasattr(config, "put_mode"):
        return None
    from ..writes.write_behind import SLAB_SHARE

    allocator = getattr(driver.manager, "_allocator", None)
    slab_bytes = sum(slab.numel() * slab.element_size() for slab in getattr(allocator, "slabs", []))
    limit = config.write_behind_max_bytes
    if slab_bytes:
        limit = min(limit, slab_bytes // SLAB_SHARE)
    return config.put_mode, limit


def _backend_info(driver: ManagerDriver, connector: Any) -> dict[str, Any]:
    config = getattr(connector, "config", None)
    kind = type(connector)
    return {
        "config": driver.config_path or None,
        "remote_url": getattr(config, "remote_url", "?"),
        "embedded_engine": bool(getattr(config, "uses_embedded_engine", False)),
        **_store_mode(config),
        "manager": type(driver.manager).__name__,
        "connector": f"{kind.__module__}.{kind.__qualname__}",
    }


def _store_mode(config: Any) -> dict[str, Any]:
    """Where the blocks went: an EIC cluster, or the embedded engine's
    in-process store, or its shared one (which other processes see too)."""
    if config is None or not config.uses_embedded_engine:
        return {"store_mode": "eic", "store_dir": None}
    from ..engine import parse_endpoint

    _, params = parse_endpoint(config.endpoint)
    if "dir" in params:
        return {"store_mode": "shared", "store_dir": params["dir"]}
    return {"store_mode": "in-process", "store_dir": None}


def _exit_status(summary: dict[str, Any], err: TextIO) -> int:
    if summary["mismatched_blocks"]:
        print(
            f"aibrix-eic bench: {summary['mismatched_blocks']} reloaded blocks differ from what was offloaded", file=err
        )
        return 1
    if summary["tokens"]["offered"] and not summary["tokens"]["reloaded"]:
        first = summary["errors"][0] if summary["errors"] else "every acquire missed"
        print(f"aibrix-eic bench: nothing was reloaded ({first})", file=err)
        return 1
    return 0
