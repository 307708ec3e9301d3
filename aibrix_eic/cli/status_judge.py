"""What two readings of a server's metrics say about each connector (one
per TP rank), and the verdict with its exit code, for `aibrix-eic status`.

Rates and fractions are differences of the counters between two readings,
divided by the seconds between them (a rate) or by the requests or blocks
of the same window (a fraction). With one reading (`--interval 0`, or the
first of `--watch`) the window is the counters' whole life: since each
worker started.

A rank is
- down (exit 3): its circuit breaker is open (EIC unreachable or failing
  whole calls: requests fail fast, vLLM computes everything), or its
  connector was closed;
- degraded (exit 1): in the window, over 5 % of its get, put and delete
  requests failed or hit their deadline (not exists: AIBrix makes many
  exists calls per prompt, 31 for a 31-block one in the e2e suite, which
  would dilute a failing store's share), or over 5 % of the blocks
  write-behind accepted were lost, or the breaker opened and closed again,
  or AIBrix sent requests the connector refused as invalid;
- healthy (exit 0) otherwise, with or without traffic.
No series at all (metrics off, PROMETHEUS_MULTIPROC_DIR unset and no
metrics_port, or not our server) and an unreadable source exit 4. Exit 2
stays argparse's: a command-line error.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

from .status_read import VLLM_HITS, VLLM_QUERIES, Rank, Scrape

HEALTHY, DEGRADED, DOWN, UNREACHABLE = 0, 1, 3, 4
VERDICTS = {HEALTHY: "healthy", DEGRADED: "degraded", DOWN: "down", UNREACHABLE: "unreachable"}
# The docstring's 5 %: the alerts' threshold (deploy/monitoring: AIBrixEICTimeoutsRising, AIBrixEICWriteBehindLosing).
DEGRADED_FRACTION = 0.05
DATA_OPS = ("get", "put", "delete")


@dataclass
class RankReport:
    partition: str
    eic_namespace: str
    model: str
    identity: str | None  # the key identity token; None from builds without the series
    state: str  # open, closed, breaker open, unknown
    breaker_trips: float  # in the window
    get_requests: float  # in the window
    get_requests_per_s: float | None  # None: one reading, no time to divide by
    get_blocks: float  # in the window, every outcome
    hit_blocks: float
    hit_rate: float | None  # hit / asked blocks in the window; None without gets
    hit_rate_total: float | None  # since the worker started
    bytes_loaded: float
    requests: float  # get, put and delete requests in the window, without invalid and fast_fail
    error_rate: float | None  # error / requests
    timeout_rate: float | None
    fast_fails: float
    invalid: float
    write_behind_pending_bytes: float | None
    write_behind_accepted: float
    write_behind_lost: float
    write_behind_lost_total: float
    store_used_bytes: float | None  # the embedded engine's store only
    store_capacity_bytes: float | None
    store_evictions: float | None
    code: int = HEALTHY
    reasons: list[str] = field(default_factory=list)


@dataclass
class Report:
    source: str
    window_s: float | None  # seconds between the readings; None: since start
    code: int
    verdict: str
    vllm_model: str | None
    vllm_reused_tokens: float | None  # vLLM's external prefix cache hits, in the window
    vllm_queried_tokens: float | None
    ranks: list[RankReport]

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict_code"] = VERDICTS[self.code]
        return out


def _delta(now: Scrape, before: Scrape | None, name: str, rank: Rank | None = None, **labels: str) -> float:
    current = now.value(name, rank, **labels) or 0.0
    if before is None:
        return current
    previous = before.value(name, rank, **labels) or 0.0
    # A counter below its last reading: the worker restarted, counting from 0.
    return current - previous if current >= previous else current


def _fraction(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _state(now: Scrape, rank: Rank) -> tuple[str, str | None]:
    opened = now.label_values("aibrix_eic_connector_open", "identity", rank)
    identity = max(opened, key=lambda k: opened[k]) if opened else None
    if (now.value("aibrix_eic_breaker_open", rank) or 0) >= 1:
        return "breaker open", identity
    if not opened:
        return "unknown", None
    return ("open" if max(opened.values()) >= 1 else "closed"), identity


def judge_rank(now: Scrape, before: Scrape | None, rank: Rank, seconds: float | None) -> RankReport:
    def d(name: str, **labels: str) -> float:
        return _delta(now, before, name, rank, **labels)

    state, identity = _state(now, rank)
    gets = d("aibrix_eic_requests_total", op="get")
    get_blocks = d("aibrix_eic_blocks_total", op="get")
    hits = d("aibrix_eic_blocks_total", op="get", outcome="hit")
    total_gets = now.value("aibrix_eic_blocks_total", rank, op="get") or 0.0
    outcomes = now.label_values("aibrix_eic_requests_total", "outcome", rank)
    fast_fails = d("aibrix_eic_requests_total", outcome="fast_fail")  # every op, exists too
    invalid = d("aibrix_eic_requests_total", outcome="invalid")
    # Data requests only: exists() is counted per call, one per block
    # AIBrix asks about, and would dilute the failures of a failing store.
    data = {
        outcome: sum(d("aibrix_eic_requests_total", op=op, outcome=outcome) for op in DATA_OPS) for outcome in outcomes
    }
    requests = sum(data.values()) - data.get("fast_fail", 0.0) - data.get("invalid", 0.0)
    accepted = d("aibrix_eic_write_behind_blocks_total", outcome="accepted")
    lost = d("aibrix_eic_write_behind_blocks_total", outcome="lost")
    report = RankReport(
        partition=rank[2],
        eic_namespace=rank[0],
        model=rank[1],
        identity=identity,
        state=state,
        breaker_trips=d("aibrix_eic_breaker_trips_total"),
        get_requests=gets,
        get_requests_per_s=gets / seconds if seconds else None,
        get_blocks=get_blocks,
        hit_blocks=hits,
        hit_rate=_fraction(hits, get_blocks),
        hit_rate_total=_fraction(
            now.value("aibrix_eic_blocks_total", rank, op="get", outcome="hit") or 0.0, total_gets
        ),
        bytes_loaded=d("aibrix_eic_bytes_total", direction="in"),
        requests=requests,
        error_rate=_fraction(data.get("error", 0.0), requests),
        timeout_rate=_fraction(data.get("timeout", 0.0), requests),
        fast_fails=fast_fails,
        invalid=invalid,
        write_behind_pending_bytes=now.value("aibrix_eic_write_behind_pending_bytes", rank),
        write_behind_accepted=accepted,
        write_behind_lost=lost,
        write_behind_lost_total=now.value("aibrix_eic_write_behind_blocks_total", rank, outcome="lost") or 0.0,
        store_used_bytes=now.value("aibrix_eic_store_used_bytes", rank),
        store_capacity_bytes=now.value("aibrix_eic_store_capacity_bytes", rank),
        store_evictions=now.value("aibrix_eic_store_evictions_total", rank),
    )
    _grade(report)
    return report


def _grade(rank: RankReport) -> None:
    """Sets the rank's code and the reasons for it."""
    if rank.state == "breaker open":
        rank.code = DOWN
        rank.reasons.append("circuit breaker open: requests fail fast, vLLM computes everything")
    elif rank.state == "closed":
        rank.code = DOWN
        rank.reasons.append("connector closed")
    failing = [
        f"{name} {value:.0%} of requests"
        for name, value in (("errors", rank.error_rate), ("timeouts", rank.timeout_rate))
        if value is not None and value > DEGRADED_FRACTION
    ]
    lost = _fraction(rank.write_behind_lost, rank.write_behind_accepted)
    if rank.write_behind_lost and (lost is None or lost > DEGRADED_FRACTION):
        failing.append(f"write-behind lost {rank.write_behind_lost:.0f} blocks")
    if rank.breaker_trips and rank.state != "breaker open":
        failing.append(f"breaker opened {rank.breaker_trips:.0f} times")
    if rank.invalid:
        failing.append(f"{rank.invalid:.0f} requests refused as invalid")
    if failing:
        rank.code = max(rank.code, DEGRADED)
        rank.reasons.extend(failing)


def _vllm_model(now: Scrape) -> str | None:
    names = {dict(labels).get("model_name") for (name, labels) in now.samples if name.startswith("vllm:")}
    names.discard(None)
    return ", ".join(sorted(n for n in names if n)) or None


def judge(now: Scrape, before: Scrape | None = None) -> Report:
    """The report of reading `now`, with rates since `before` (None: since start)."""
    seconds = now.at - before.at if before is not None else None
    ranks = [judge_rank(now, before, rank, seconds) for rank in now.ranks()]
    code = max((r.code for r in ranks), default=UNREACHABLE)
    reused = queried = None
    if now.value(VLLM_QUERIES) is not None:
        reused, queried = _delta(now, before, VLLM_HITS), _delta(now, before, VLLM_QUERIES)
    return Report(
        source=now.source,
        window_s=seconds,
        code=code,
        verdict=verdict_line(ranks, code),
        vllm_model=_vllm_model(now),
        vllm_reused_tokens=reused,
        vllm_queried_tokens=queried,
        ranks=ranks,
    )


def unreachable(source: str, why: str) -> Report:
    return Report(source, None, UNREACHABLE, f"unreachable: {why}", None, None, None, [])


def verdict_line(ranks: list[RankReport], code: int) -> str:
    if not ranks:
        return (
            "unreachable: no aibrix_eic_* series (metrics: false, or neither PROMETHEUS_MULTIPROC_DIR "
            "nor metrics_port set, or not a server with the EIC connector)"
        )
    bad = [r for r in ranks if r.code == code and code != HEALTHY]
    count = f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    if not bad:
        return f"healthy: {count}"
    return f"{VERDICTS[code]}: " + "; ".join(f"{r.partition}: {', '.join(r.reasons)}" for r in bad) + f" ({count})"
