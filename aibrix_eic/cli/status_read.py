"""One reading of a running server's metrics for `aibrix-eic status`: the
samples of its `/metrics` page, or of the prometheus_client multiprocess
directory its workers write (PROMETHEUS_MULTIPROC_DIR, where vLLM's
/metrics reads them from: docs/operations.md#on-vllms-metrics).

Only prometheus_client and the standard library: no torch, no AIBrix, so the
command runs in a second or less wherever the package is installed.
"""

import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "aibrix_eic_"
RANK_LABELS = ("eic_namespace", "model", "partition")
# vLLM's own counters of what its KV connector loaded, in tokens
# (vllm/v1/metrics/loggers.py: the "External prefix cache hit rate" log line).
VLLM_HITS = "vllm:external_prefix_cache_hits_total"
VLLM_QUERIES = "vllm:external_prefix_cache_queries_total"
Rank = tuple[str, str, str]  # (eic_namespace, model, partition)
Labels = frozenset[tuple[str, str]]


class Unreachable(Exception):
    """The metrics could not be read at all (connection refused, HTTP error,
    no such directory): the message says which and why."""


@dataclass
class Scrape:
    """Every sample of one reading, by (name, labels); `at`: time.monotonic()."""

    source: str
    at: float
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)

    def ranks(self) -> list[Rank]:
        """The connectors (one per TP rank) that have series, sorted."""
        return sorted(
            {
                tuple(dict(labels).get(name, "") for name in RANK_LABELS)  # type: ignore[misc]
                for (sample, labels) in self.samples
                if sample.startswith(PREFIX) and "partition" in dict(labels)
            }
        )

    def value(self, name: str, rank: Rank | None = None, **labels: str) -> float | None:
        """Sum of the samples of `name` whose labels include `labels` (and
        the rank's); None when there is no such sample at all."""
        wanted = set(labels.items())
        if rank is not None:
            wanted |= set(zip(RANK_LABELS, rank))
        found = [v for (n, ls), v in self.samples.items() if n == name and wanted <= ls]
        return sum(found) if found else None

    def label_values(self, name: str, label: str, rank: Rank | None = None) -> dict[str, float]:
        """label value -> sample value, of the samples of `name` (for the rank)."""
        wanted = set(zip(RANK_LABELS, rank)) if rank is not None else set()
        return {
            dict(ls)[label]: v
            for (n, ls), v in self.samples.items()
            if n == name and wanted <= ls and label in dict(ls)
        }


def _samples(families: Iterable[Any]) -> dict[tuple[str, Labels], float]:
    out: dict[tuple[str, Labels], float] = {}
    for family in families:
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            out[key] = out.get(key, 0.0) + sample.value
    return out


def parse_text(text: str, source: str = "text", at: float | None = None) -> Scrape:
    """A scrape from Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        samples = _samples(text_string_to_metric_families(text))
    except ValueError as e:
        raise Unreachable(f"{source}: not Prometheus metrics text ({e})") from None
    return Scrape(source, time.monotonic() if at is None else at, samples)


def metrics_url(url: str) -> str:
    """The /metrics URL of a server given as host:port, a base URL or the URL itself."""
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url += "/metrics"
    return url


def read_url(url: str, timeout_s: float) -> Scrape:
    url = metrics_url(url)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 (an operator-given URL)
            text = reply.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        raise Unreachable(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise Unreachable(f"{url}: cannot read ({reason})") from None
    return parse_text(text, url)


def read_directory(directory: str) -> Scrape:
    """The series the workers wrote to a multiprocess directory, merged as
    vLLM's /metrics merges them (prometheus_client's MultiProcessCollector)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    path = Path(directory)
    if not path.is_dir():
        raise Unreachable(f"{directory}: no such directory (PROMETHEUS_MULTIPROC_DIR of the vLLM pod)")
    registry = CollectorRegistry()
    try:
        MultiProcessCollector(registry, path=str(path))
        samples = _samples(registry.collect())
    except (OSError, ValueError) as e:
        raise Unreachable(f"{directory}: cannot read the metrics files ({e})") from None
    return Scrape(str(path), time.monotonic(), samples)


def read(source: Mapping[str, str], timeout_s: float) -> Scrape:
    """source: {"url": ...} or {"directory": ...}."""
    if "directory" in source:
        return read_directory(source["directory"])
    return read_url(source["url"], timeout_s)
