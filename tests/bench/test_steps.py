"""bench._steps: the cadence that interleaves busy and idle windows, the cycles, the ratio and its
bootstrap interval (pure; the figures themselves come from python -m bench save_overhead)."""

from __future__ import annotations

import random

from bench._steps import Cadence, cycles, step_ratio


def test_the_cadence_saves_once_the_idle_window_matches_the_busy_one() -> None:
    cadence = Cadence(saves=2, min_idle=3)
    # GIVEN 3 idle steps of warm-up THEN the first save
    assert [cadence.after_step(False) for _ in range(3)] == ["", "", "save"]
    # WHEN the finish keeps 5 steps busy THEN 5 idle steps come before the next save
    assert [cadence.after_step(True) for _ in range(5)] == [""] * 5
    assert [cadence.after_step(False) for _ in range(5)] == [""] * 4 + ["save"]
    # and after the last save's busy and idle windows, the run stops
    assert [cadence.after_step(b) for b in (True, False, False, False)] == ["", "", "", "stop"]


def test_cycles_pair_each_busy_window_with_the_idle_one_after_it() -> None:
    steps = [(9.0, False), (1.0, True), (1.1, True), (0.5, False), (2.0, True), (0.6, False)]
    # THEN the warm-up before the first save is left out
    assert cycles(steps) == [([1.0, 1.1], [0.5]), ([2.0], [0.6])]
    assert cycles([(1.0, True)]) == []


def test_the_interval_covers_the_ratio_and_narrows_with_more_cycles() -> None:
    rng = random.Random(1)

    def run(n: int) -> list[tuple[float, bool]]:
        steps: list[tuple[float, bool]] = []
        for _ in range(n):
            steps += [(1.10 * rng.lognormvariate(0, 0.2), True) for _ in range(20)]
            steps += [(rng.lognormvariate(0, 0.2), False) for _ in range(20)]
        return steps

    few, many = step_ratio(run(3)), step_ratio(run(40))
    assert few is not None and many is not None
    assert few.low <= few.ratio <= few.high and many.low <= many.ratio <= many.high
    # THEN 40 cycles of 20 steps tell a 10 % slowdown from none; the interval narrows
    assert many.low > 1.0 and many.high - many.low < few.high - few.low
    assert (many.busy, many.idle, many.cycles) == (800, 800, 40)
    assert step_ratio([(1.0, False)]) is None
