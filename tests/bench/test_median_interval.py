"""bench._harness.median_interval (pure): the order statistics the sign test gives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench._harness import median_interval


def test_forty_runs_give_the_14th_and_27th_values() -> None:
    # P(Binomial(40, 1/2) <= 13) = 1.9 % <= 2.5 % < P(<= 14) = 4.0 %: the textbook 14th and 27th.
    assert median_interval([float(v) for v in range(1, 41)]) == (14.0, 27.0)


def test_too_few_runs_for_95_percent_give_the_whole_range() -> None:
    # Five runs: P(all five above the median) = 1/32 = 3.1 % > 2.5 %.
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=80))
def test_the_interval_holds_the_median_and_is_made_of_runs(values: list[float]) -> None:
    low, high = median_interval(values)
    ordered = sorted(values)
    assert low in values and high in values
    assert low <= ordered[(len(values) - 1) // 2] and ordered[len(values) // 2] <= high
