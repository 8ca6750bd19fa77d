"""``percentile``: the one way every benchmark turns samples into p50, p90, p99.

Linear interpolation between the two closest ranks, numpy's default: a figure reads
the same as one computed with numpy or pandas from the same samples, and a p50 is the
median (``statistics.median``), the mean of the two middle values of an even sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], p: float) -> float:
    """The ``p``-th percentile of ``values``, as ``numpy.percentile(values, p)`` gives it.

    Args:
        values: the samples, in any order.
        p: from 0 (the smallest value) to 100 (the largest); 50 is the median.

    Raises:
        ValueError: ``values`` is empty, or ``p`` is outside [0, 100].
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the percentile of no values is undefined: measure at least once")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p!r} is outside [0, 100] (p99 is 99, not 0.99)")
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
