"""Order statistics the benchmarks report, one definition for all of them.

Owns: `nearest_rank`, the percentile bench-e2e and its hot-account section print (the value at
rank floor(n * q / 100) of the sorted samples, the largest for q = 100). Must never: interpolate
(a reported p99 is always a latency that was measured) or drop a sample.
"""

from __future__ import annotations


def nearest_rank(values: list[float], q: float) -> float | None:
    """The `q`-th percentile of `values` by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]
