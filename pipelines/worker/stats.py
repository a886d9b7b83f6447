"""Latency statistics from raw per-sample timings, without numpy (workers may not have it).

Definitions (each matches numpy on the same samples, before rounding to whole nanoseconds):
- median, p05, p95: linear interpolation between closest ranks (numpy.percentile's default,
  method="linear": rank h = (n - 1) * q).
- mad: median absolute deviation from the median, unscaled (median(|x - median(x)|)).
- confidence95: the distribution-free order-statistic interval for the median. With B ~
  Binomial(n, 1/2), the interval [x_(l), x_(n-l+1)] (1-based order statistics) covers the true
  median with probability 1 - 2 * P(B <= l - 1); l is the largest rank keeping that >= 0.95.
  Exact binomial sums up to MAX_EXACT_N samples, the normal approximation above. Fewer than 6
  samples cannot reach 95% this way: the interval is then absent.
Nanosecond values are rounded half up (as JavaScript's Math.round, like the Liger importer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines.records.rules import half_up

MAX_EXACT_N = 5000
CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class LatencySummary:
    samples: int
    median: int
    mean: int
    p05: int
    p95: int
    minimum: int
    maximum: int
    mad: int
    confidence95: tuple[int, int] | None

    def latency_ns(self) -> dict[str, object]:
        """The BenchmarkRun `spec.timing.latencyNs` object."""
        latency: dict[str, object] = {
            "median": self.median,
            "mean": self.mean,
            "p05": self.p05,
            "p95": self.p95,
            "minimum": self.minimum,
            "maximum": self.maximum,
            "mad": self.mad,
        }
        if self.confidence95 is not None:
            latency["confidence95"] = list(self.confidence95)
        return latency


round_half_up = half_up  # the rulebook's rounding (pipelines/records/rules.py)


def percentile(ordered: Sequence[float], q: float) -> float:
    """numpy.percentile(x, 100 * q) with the default linear method, on sorted data."""
    rank = (len(ordered) - 1) * q
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def median_rank_interval(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks (l, n - l + 1) of the order-statistic confidence interval of the median."""
    if n < 1:
        return None
    alpha_half = (1.0 - confidence) / 2.0
    if n <= MAX_EXACT_N:
        total = 2**n
        tail = 0  # P(B <= l - 1) * 2**n
        best = 0
        for rank in range(1, n // 2 + 1):
            tail += math.comb(n, rank - 1)
            if tail / total > alpha_half:
                break
            best = rank
    else:
        best = math.floor(n / 2 - 1.959963984540054 * math.sqrt(n) / 2)
    if best < 1:
        return None
    return best, n - best + 1


def summarize_ns(samples: Sequence[float]) -> LatencySummary:
    """Summarize per-sample latencies given in nanoseconds (ints or floats)."""
    if not samples:
        raise ValueError("no samples")
    if any(not math.isfinite(s) or s < 0 for s in samples):
        raise ValueError("samples must be finite, non-negative nanoseconds")
    ordered = sorted(float(s) for s in samples)
    median = percentile(ordered, 0.5)
    deviations = sorted(abs(s - median) for s in ordered)
    ranks = median_rank_interval(len(ordered))
    interval = None
    if ranks is not None:
        interval = (round_half_up(ordered[ranks[0] - 1]), round_half_up(ordered[ranks[1] - 1]))
    return LatencySummary(
        samples=len(ordered),
        median=round_half_up(median),
        mean=round_half_up(math.fsum(ordered) / len(ordered)),
        p05=round_half_up(percentile(ordered, 0.05)),
        p95=round_half_up(percentile(ordered, 0.95)),
        minimum=round_half_up(ordered[0]),
        maximum=round_half_up(ordered[-1]),
        mad=round_half_up(percentile(deviations, 0.5)),
        confidence95=interval,
    )
