"""bench._probe: where a step's time goes (on a CPU, waiting for one, blocked), and the summary
that sets busy steps beside idle ones (pure, but for one real sample of this thread)."""

from __future__ import annotations

import sys

import pytest

from bench._probe import STAT_KINDS, StepClock, StepProbe, combine, summary


def test_a_step_is_busy_if_the_finisher_was_at_its_start_or_end() -> None:
    assert combine("idle", "busy") == combine("busy", "waiting") == "busy"
    assert combine("waiting", "idle") == combine("idle", "waiting") == "waiting"
    assert combine("idle", "idle") == "idle"


def test_the_summary_splits_wall_time_into_cpu_queue_and_blocked() -> None:
    # GIVEN busy steps of 3 ms (1 on a CPU, 1.5 queued) and idle ones of 2 ms (1 on a CPU)
    busy = (0.001, 0.0015, 0.0, 0.0, *[0.0] * len(STAT_KINDS))
    idle = (0.001, 0.0, 0.0, 0.0, *[0.0] * len(STAT_KINDS))
    steps = [(0.003, True), (0.003, True), (0.002, False)]
    text = summary(steps, [busy, busy, idle])
    # THEN each part is set beside the other window's, the rest of the wall time is blocked
    assert "wall 3.00 / 2.00" in text and "on-CPU 1.00 / 1.00" in text, text
    assert "run-queue wait 1.50 / 0.00" in text and "blocked 0.50 / 1.00" in text, text
    assert summary(steps[2:], [idle]) == "trace: -"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_clock_records_steps_with_their_trace_and_leaves_waiting_ones_out() -> None:
    steps: list[tuple[float, bool]] = []
    traces: list[tuple[float, ...]] = []
    states = iter(["idle", "busy", "waiting", "waiting"])
    clock = StepClock(steps, traces, lambda: next(states))  # type: ignore[arg-type,return-value]
    # WHEN a step starts idle and ends busy, then one starts and ends waiting
    clock.begin()
    sum(range(100_000))
    assert clock.end() == "busy"
    clock.begin()
    assert clock.end() == "waiting"
    # THEN only the first is recorded, busy, with its CPU time and the machine's by kind
    assert [busy for _, busy in steps] == [True]
    (trace,) = traces
    assert len(trace) == 4 + len(STAT_KINDS) and 0 < trace[0] <= steps[0][0] + 0.01
    StepProbe().close()
