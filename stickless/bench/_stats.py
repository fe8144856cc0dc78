"""Small statistics helpers: percentiles, summaries, spreads across repeats, ratios."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

#: Decimal places kept in the JSON (milliseconds to 0.1 microsecond).
DIGITS = 4


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    fraction = rank - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * fraction)


def rounded(value: float | None, digits: int = DIGITS) -> float | None:
    return None if value is None else round(float(value), digits)


def summarize(samples: Sequence[float], repeats: Sequence[Sequence[float]] = ()) -> dict[str, Any]:
    """n, mean, p50, p95, p99, min and max of the pooled samples; with `repeats` (the same
    samples grouped by repeat) also the min and max of each repeat's p50 and p99."""
    if not samples:
        return {"n": 0}
    summary: dict[str, Any] = {
        "n": len(samples),
        "mean": rounded(sum(samples) / len(samples)),
        "p50": rounded(percentile(samples, 50)),
        "p95": rounded(percentile(samples, 95)),
        "p99": rounded(percentile(samples, 99)),
        "min": rounded(min(samples)),
        "max": rounded(max(samples)),
    }
    groups = [list(group) for group in repeats if group]
    if groups:
        summary["repeats"] = len(groups)
        summary["across_repeats"] = spread(groups)
    return summary


def spread(groups: Sequence[Sequence[float]]) -> dict[str, list[float | None]]:
    """[min, max] across repeats of each repeat's p50 and p99."""
    p50s = [percentile(group, 50) for group in groups]
    p99s = [percentile(group, 99) for group in groups]
    return {
        "p50": [rounded(min(p50s)), rounded(max(p50s))],
        "p99": [rounded(min(p99s)), rounded(max(p99s))],
    }


def value_spread(values: Sequence[float]) -> dict[str, Any]:
    """Summary of one number measured once per repeat (e.g. a rate): mean, median, min, max."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean": rounded(sum(values) / len(values)),
        "p50": rounded(percentile(values, 50)),
        "min": rounded(min(values)),
        "max": rounded(max(values)),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator rounded to 3 places, or None when either is missing or zero."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, 3)


def flatten(groups: Iterable[Sequence[float]]) -> list[float]:
    return [value for group in groups for value in group]
