"""bench._steps: the cadence that interleaves busy and idle windows, the cycles, the ratio and its
bootstrap interval (pure; the figures themselves come from python -m bench save_overhead)."""

from __future__ import annotations

import random

from bench._steps import Cadence, cycles, relative_ratio, step_ratio


def test_the_cadence_saves_once_the_idle_window_matches_the_busy_one() -> None:
    cadence = Cadence(saves=2, min_idle=3)
    # GIVEN 3 idle steps of warm-up THEN the first save
    assert [cadence.after_step(False) for _ in range(3)] == ["", "", "save"]
    # WHEN the finish keeps 5 steps busy THEN 5 idle steps come before the next save
    assert [cadence.after_step(True) for _ in range(5)] == [""] * 5
    assert [cadence.after_step(False) for _ in range(5)] == [""] * 4 + ["save"]
    # and after the last save's busy and idle windows, the run stops
    assert [cadence.after_step(b) for b in (True, False, False, False)] == ["", "", "", "stop"]


def test_waiting_steps_count_in_neither_window_and_hold_the_next_save() -> None:
    cadence = Cadence(saves=2, min_idle=2)
    assert [cadence.after_step(False) for _ in range(2)] == ["", "save"]
    # GIVEN the control's save dirty for 10 steps before the kernel writes it back in 3
    assert [cadence.after_step(False, waiting=True) for _ in range(10)] == [""] * 10
    assert [cadence.after_step(True) for _ in range(3)] == [""] * 3
    # THEN the idle window matches the 3 write-back steps, not the 13
    assert [cadence.after_step(False) for _ in range(3)] == ["", "", "save"]


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


def test_a_run_over_its_control_divides_the_two_ratios_and_widens_the_interval() -> None:
    rng = random.Random(2)

    def run(cost: float) -> list[tuple[float, bool]]:
        steps: list[tuple[float, bool]] = []
        for _ in range(40):
            steps += [(cost * rng.lognormvariate(0, 0.1), True) for _ in range(20)]
            steps += [(rng.lognormvariate(0, 0.1), False) for _ in range(20)]
        return steps

    # GIVEN a finish at 1.2x and a control at 1.1x
    finish, control = run(1.2), run(1.1)
    rel, alone = relative_ratio(finish, control), step_ratio(finish)
    # THEN the finish's own cost is ~1.09x, its interval wider than either run's alone
    assert rel is not None and alone is not None
    assert rel.low < 1.2 / 1.1 < rel.high and rel.high - rel.low > alone.high - alone.low
    assert relative_ratio(finish, []) is None
