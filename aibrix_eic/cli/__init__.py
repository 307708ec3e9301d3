"""The `aibrix-eic` command (also `python -m aibrix_eic`).

    aibrix-eic check [--config FILE] [--json]    is the connector ready? (exit 1 if not)
    aibrix-eic check --config-only --config FILE    is this config valid? (no connection)
    aibrix-eic bench [--config FILE]    offload/reload through AIBrix's cache manager
    aibrix-eic status [URL] [--json] [--watch S]    what a running vLLM server's connectors do

Argument parsing only; each command lives in its own module and is imported
when chosen, so `--help` stays fast.
"""

import argparse
import sys
from collections.abc import Callable, Sequence

from ..util.units import parse_size


def _size(text: str) -> int:
    """A size option (a block's bytes): 0 is refused, never read as "default"."""
    try:
        nbytes = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if nbytes <= 0:
        raise argparse.ArgumentTypeError(f"expected a size > 0 such as 64KiB or 2MiB, got {text!r}")
    return nbytes


def _whole_number(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


def version_line() -> str:
    """Our version and the versions it runs with, for bug reports. Read
    from installed metadata, so nothing heavy is imported."""
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return (
        f"aibrix-eic {__version__} (aibrix-kvcache {installed('aibrix-kvcache')}, "
        f"torch {installed('torch')}, Python {sys.version.split()[0]})"
    )


def build_parser() -> argparse.ArgumentParser:
    from .shapes import DEFAULT_SHAPE, SHAPES

    parser = argparse.ArgumentParser(
        prog="aibrix-eic",
        description="Check and benchmark the EIC L2 connector for AIBrix KV-cache offloading.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", required=True, metavar="{check,bench,status}")

    config_help = (
        "the connector's YAML config (default: $AIBRIX_KV_CACHE_OL_EIC_CONFIG, else "
        "$AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE, else the embedded engine)"
    )
    check = commands.add_parser(
        "check",
        help="open the connector as AIBrix would and round-trip a block",
        description="Open the connector exactly as AIBrix would, register a buffer, round-trip "
        "put/exists/get/delete, and check the namespace and the TTL. Exit status 0 only if "
        "no step failed (warnings do not fail it).",
    )
    check.add_argument("--config", metavar="FILE", help=config_help)
    check.add_argument(
        "--config-only",
        action="store_true",
        help="validate the config and stop: no connection, and files the config names on its node "
        "(eic_flag_file) are warnings when absent here, so a production config can be checked anywhere "
        "(PyYAML is all it needs; an eic:// config notes whether this host has the vendor SDK)",
    )
    check.add_argument(
        "--block-size",
        type=_size,
        metavar="SIZE",
        help="bytes of the test block (default: the config's block_nbytes, else 2MiB)",
    )
    check.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object instead of text: the verdict and a list of steps, each with its "
        "config problems as records (file, line, variable, key, problem, fix)",
    )
    check.add_argument("-v", "--verbose", action="store_true", help="show library logs")

    from ..util.units import format_size

    shape_lines = "\n".join(
        f"  {shape.name:<16} {format_size(shape.bytes_per_token)}/token  {shape.description}"
        for shape in SHAPES.values()
    )
    bench = commands.add_parser(
        "bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"model shapes (per TP rank, 16-token blocks, LCND):\n{shape_lines}",
        help="offload and reload KV blocks through AIBrix's BaseKVCacheManager",
        description="Drive AIBrix's BaseKVCacheManager (L2 backend EIC, as vLLM's AIBrix "
        "connectors build it in each TP rank) with a multi-turn workload: offload each "
        "request's KV blocks, reload them with acquire, verify every byte.",
    )
    bench.add_argument("--config", metavar="FILE", help=config_help)
    bench.add_argument(
        "--model",
        choices=sorted(SHAPES),
        default=DEFAULT_SHAPE,
        help=f"KV shape of one TP rank (default {DEFAULT_SHAPE})",
    )
    bench.add_argument("--tokens", type=_whole_number(1), default=2048, help="prompt tokens per request (default 2048)")
    bench.add_argument("--requests", type=_whole_number(1), default=8, help="timed requests (default 8)")
    bench.add_argument("--warmup", type=_whole_number(0), default=2, help="untimed requests first (default 2)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random prompts and KV bytes")
    bench.add_argument(
        "--shared-dir",
        metavar="DIR",
        help="without --config: put the embedded engine's store in DIR (its shared mode), "
        "so that several bench processes run against one store; what the run created there "
        "is removed afterwards unless --keep",
    )
    bench.add_argument("--keep", action="store_true", help="with --shared-dir: keep the store after the run")
    bench.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the same-run baselines (AIBrix's MOCK backend and memcpy) and the verdict",
    )
    bench.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    bench.add_argument("--plot", metavar="PNG", help="draw throughput and latency plots into this file")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("-v", "--verbose", action="store_true", help="show library logs")
    _add_status(commands)
    return parser


def _add_status(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from .status_judge import __doc__ as exit_codes

    status = commands.add_parser(
        "status",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="read a running vLLM server's EIC connectors from its metrics",
        description="Read a running vLLM server's aibrix_eic_* series (its /metrics, or the "
        "PROMETHEUS_MULTIPROC_DIR its workers write) twice, --interval apart, and report per TP "
        "rank: state, hit rate, errors, timeouts, write-behind, the embedded store; then a verdict.",
        epilog=(exit_codes or "").split("\n\n", 1)[-1],
    )
    status.add_argument(
        "url",
        nargs="?",
        default="http://127.0.0.1:8000/metrics",
        help="the server's /metrics URL, or host:port (default http://127.0.0.1:8000/metrics)",
    )
    status.add_argument(
        "--multiproc-dir",
        metavar="DIR",
        help="read the workers' series from this PROMETHEUS_MULTIPROC_DIR instead of a URL (on the pod)",
    )
    status.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between the two readings that rates come from (default 2; 0: one reading, "
        "rates since the workers started)",
    )
    status.add_argument(
        "--watch", type=float, metavar="S", help="report every S seconds, rates since the last report, until Ctrl-C"
    )
    status.add_argument("--count", type=_whole_number(1), metavar="N", help="with --watch: stop after N reports")
    status.add_argument("--timeout", type=float, default=5.0, metavar="S", help="HTTP timeout (default 5)")
    status.add_argument("--json", action="store_true", help="one JSON document per report")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "check":
        return _check(args)
    if args.command == "status":  # reads metrics only: no AIBrix, no torch
        from .status import run_status

        return run_status(args, sys.stdout)

    from .runtime import library_logs, prepare_aibrix

    prepare_aibrix()
    with library_logs(args.verbose):
        from .bench import run_bench

        return run_bench(args, sys.stdout, sys.stderr)


def _check(args: argparse.Namespace) -> int:
    """`check`; with --config-only, nothing but the config and PyYAML is
    imported (no torch, no aibrix_kvcache: tests/tools/test_check_light.py)."""
    from ..config import ENV_CONFIG, config_path_from_env
    from .runtime import library_logs, scoped_env

    env = {ENV_CONFIG: args.config} if args.config else {}
    with scoped_env(env), library_logs(args.verbose):
        if not args.json:
            where = config_path_from_env() or "the embedded engine (no config)"
            print(f"aibrix-eic check: {where}", file=sys.stdout)
        if args.config_only:
            from .check_config import ConfigOnlyCheck

            return ConfigOnlyCheck(sys.stdout, args.json).run()

        from ..plugin import is_installed
        from .runtime import prepare_aibrix

        routed_at_start = is_installed()
        prepare_aibrix()
        from .check import run_check

        return run_check(args.block_size, routed_at_start, sys.stdout, as_json=args.json)


__all__ = ["main", "build_parser"]
