"""What a bench result means: our rates against the same-run baselines
(baseline.py), graded; a note when the rounds spread; and whether
write-behind took the puts, and if not, why. Pure functions of the figures:
every rate is report.py's one computation (bytes over time), so the ratio
is the printed rates' quotient.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from ..util.units import format_size

# Grades of our rate as a share of AIBrix's MOCK floor in the same rounds.
# The floor is AIBrix's own path with a backend that only copies each block;
# ours adds the key codec, the SDK calls and a flush, and passes the floor
# only by copying on several threads. At 0.7x ours takes at most ~1.4 times
# the floor's time (good); below 0.4x more than 2.5 times (slow: look at
# EIC's latency, the breaker, the host's load).
GOOD = 0.7
FAIR = 0.4
# Rounds are noisy when (max - min) of the per-request rates over the run's rate is above this.
NOISY = 0.5
THRESHOLDS = {"good": GOOD, "fair": FAIR, "noisy_spread": NOISY}


def grade(ratio: float) -> str:
    if ratio >= GOOD:
        return "good"
    return "fair" if ratio >= FAIR else "slow"


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and range: with a handful of rounds the range says more than
    a percentile would."""
    ordered = sorted(values)
    if not ordered:
        return {"median": 0.0, "min": 0.0, "max": 0.0}
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {"median": median, "min": ordered[0], "max": ordered[-1]}


def ratios(ours: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Our rate over the baseline's, round by round (rounds run back to back)."""
    return [o / b for o, b in zip(ours, baseline) if b > 0]


def judge(
    ours: Mapping[str, float],
    mock: Mapping[str, float],
    memcpy: float,
    rounds: Mapping[str, Sequence[float]],
) -> dict[str, Any]:
    """Per direction ("offload", "reload"): our rate over the MOCK floor's
    and over memcpy's, each the run's bytes over its time (report.py's one
    computation, the rates the report prints), so the printed rates divide
    to the ratio; graded. rounds: the per-round ratios, for their range."""
    verdict: dict[str, Any] = {"thresholds": THRESHOLDS}
    for direction in ("offload", "reload"):
        vs_mock = ours[direction] / mock[direction] if mock[direction] > 0 else 0.0
        verdict[direction] = {
            "vs_mock": vs_mock,
            "vs_memcpy": ours[direction] / memcpy if memcpy > 0 else 0.0,
            "rounds": spread(rounds[direction]),
            "grade": grade(vs_mock),
        }
    return verdict


def noise(per_request: Mapping[str, Sequence[float]], run_rates: Mapping[str, float]) -> dict[str, Any]:
    """How far our per-request rates stray from the run's rate (the one the
    report prints); a note when (max - min) / that rate is wide."""
    spreads = {}
    for direction, values in per_request.items():
        rate = run_rates[direction]
        low, high = (min(values), max(values)) if values else (0.0, 0.0)
        spreads[direction] = {"rate": rate, "min": low, "max": high, "relative": (high - low) / rate if rate else 0.0}
    wide = [d for d, s in spreads.items() if s["relative"] > NOISY]
    note = None
    if wide:
        ranges = "; ".join(
            f"{d} {spreads[d]['min']:.2f}-{spreads[d]['max']:.2f} GB/s (the run's {spreads[d]['rate']:.2f})"
            for d in wide
        )
        note = (
            f"per-request rates spread by more than {NOISY:.0%} of the run's rate ({ranges}): the host is busy "
            "or noisy. The baselines ran back to back with each request, so the ratios move less than the GB/s; "
            "for tighter figures run more --requests on an idle host."
        )
    return {**spreads, "noisy": bool(wide), "note": note}


def write_behind(health: dict[str, Any], put_mode: str, put_nbytes: int, limit_nbytes: int) -> dict[str, Any]:
    """How many put blocks write-behind accepted, and why not the rest.
    put_nbytes: one request's put; limit_nbytes: the pending bytes
    write-behind holds at most (write_behind_max_bytes, or a quarter of the
    registered slabs if less)."""
    total = int(health.get("put_blocks", 0))
    accepted = int(health.get("write_behind_blocks", 0))
    waited = int(health.get("write_behind_waits", 0))
    if put_mode == "direct":
        why = "put_mode direct: each put goes to EIC and returns its outcome; flush has nothing to wait for"
    elif put_mode == "coalesce":
        why = "put_mode coalesce: each put waits for the mset that stores it"
    elif total and accepted == total:
        why = "each put returned once its blocks were accepted; flush is the wait for the flusher's msets"
    elif put_nbytes > limit_nbytes:
        why = (
            f"one request puts {format_size(put_nbytes)}, more than write-behind holds "
            f"({format_size(limit_nbytes)}: write_behind_max_bytes, or a quarter of AIBrix's slabs if less), "
            f"so {waited} puts waited for EIC as in coalesce mode; with L1 on, puts are smaller"
        )
    else:
        why = f"{waited} puts found write-behind full (pending writes not yet sent) and waited for EIC"
    return {
        "put_mode": put_mode,
        "blocks": accepted,
        "of_blocks": total,
        "waits": waited,
        "limit_bytes": limit_nbytes,
        "engaged": accepted > 0,
        "why": why,
    }
