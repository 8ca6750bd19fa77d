"""``percentile``: the benchmarks' one quantile, checked against ``numpy.percentile``."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_actors.bench.stats import percentile

# Latencies and ratios as benchmarks measure them: finite, within a few orders of size.
values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
ranks = st.floats(min_value=0, max_value=100, allow_nan=False)


def agrees(ours: float, numpy: float) -> bool:
    return math.isclose(ours, numpy, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=300, deadline=None)
@given(st.lists(values, min_size=1, max_size=40), ranks)
def test_it_is_numpys_default_percentile(samples: list[float], p: float) -> None:
    assert agrees(percentile(samples, p), float(np.percentile(samples, p)))


@settings(max_examples=200, deadline=None)
@given(st.lists(values, min_size=1, max_size=20), st.booleans(), st.sampled_from([50, 90, 99]))
def test_odd_and_even_samples_alike(samples: list[float], even: bool, p: int) -> None:
    if (len(samples) % 2 == 0) != even:
        samples = [*samples, samples[0]]  # the size the example asks for
    assert agrees(percentile(samples, p), float(np.percentile(samples, p)))
    if p == 50:
        assert agrees(percentile(samples, p), statistics.median(samples))


def test_the_p50_of_an_even_sample_is_the_mean_of_its_middle_values() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([7.0], 99) == 7.0


def test_no_values_or_a_rank_outside_0_to_100_are_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], -1)
