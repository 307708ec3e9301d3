"""`aibrix-eic bench --plot out.png`: throughput per request and latency per
operation, from the bench summary. matplotlib is optional (extra `plot`) and
imported only here, with the file-only Agg backend."""

from typing import Any


class PlotUnavailable(RuntimeError):
    pass


def require_matplotlib():
    """matplotlib, or PlotUnavailable saying how to install it. The bench
    calls this before it runs, so a missing extra fails in a second, not
    after the whole benchmark."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is not installed: pip install matplotlib "
            "(or install aibrix-eic with its plot extra)"
        ) from None
    return matplotlib


def draw(summary: dict[str, Any], path: str) -> None:
    from .report import OFFLOAD_LABEL, RELOAD_LABEL

    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    per_request = summary["per_request"]
    timed = [r for r in per_request if not r["warmup"]]
    indexes = [r["index"] for r in timed]
    model = summary["model"]["name"]

    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(12, 4.5))
    offload = throughput.plot(indexes, [r["offload_gb_per_s"] for r in timed], marker="o", label=OFFLOAD_LABEL)
    reload = throughput.plot(indexes, [r["reload_gb_per_s"] for r in timed], marker="s", label=RELOAD_LABEL)
    _draw_baselines(throughput, summary.get("baseline"), offload[0].get_color(), reload[0].get_color(), indexes)
    throughput.set_xlabel("request")
    throughput.xaxis.set_major_locator(MaxNLocator(integer=True))  # requests are whole numbers
    throughput.set_ylabel("GB/s")
    throughput.set_ylim(bottom=0)
    throughput.set_title(f"Throughput per request ({model}, {summary['workload']['tokens_per_request']} tokens)")
    throughput.legend()
    throughput.grid(alpha=0.3)

    ops = [op for op, stats in summary["latency_ms"].items() if stats["count"]]
    stats = [summary["latency_ms"][op] for op in ops]
    # p99 only when there were enough calls for one (report.py), else the max.
    tail = "p99" if all(s["p99"] is not None for s in stats) else "max"
    positions = range(len(ops))
    latency.bar([p - 0.2 for p in positions], [s["p50"] for s in stats], width=0.4, label="p50")
    latency.bar([p + 0.2 for p in positions], [s[tail] for s in stats], width=0.4, label=tail)
    latency.set_xticks(list(positions), ops, rotation=30)
    latency.set_ylabel("ms per call")
    latency.set_yscale("log")
    latency.set_title("Latency per cache-manager call")
    latency.legend()
    latency.grid(alpha=0.3, axis="y")

    figure.suptitle(f"aibrix-eic bench: {summary['backend']['remote_url']}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _draw_baselines(
    axes: Any, baseline: dict[str, Any] | None, offload_color: str, reload_color: str, indexes: list[int]
) -> None:
    """The same-run baselines the verdict compares against: the MOCK floor
    per request (dashed, in the colour of the direction), memcpy (dotted)."""
    if baseline is None:
        return
    mock = baseline["mock"]["per_request"]
    for key, color, label in (
        ("offload_gb_per_s", offload_color, "MOCK floor offload"),
        ("reload_gb_per_s", reload_color, "MOCK floor reload"),
    ):
        axes.plot([r["index"] for r in mock], [r[key] for r in mock], linestyle="--", color=color, label=label)
    memcpy = baseline["memcpy"]["per_request"]
    axes.plot(indexes[: len(memcpy)], memcpy, linestyle=":", color="grey", label="memcpy")
