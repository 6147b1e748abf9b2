"""Step time while a checkpoint is finished against step time while none is (pure).

Busy and idle windows alternate through a run; the ratio is the median busy step over the median
idle step, its 95 % interval a bootstrap over whole cycles (neighbouring steps are not
independent). BENCHMARKS.md §8.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Step = tuple[float, bool]  # (seconds, the finisher was busy at its start or end)
Cycle = tuple[list[float], list[float]]  # (busy steps, idle steps after them)


class Cadence:
    """Says after each step whether to save, stop, or go on: ``saves`` cycles whose idle window
    is at least as long (in steps) as the busy window before it, and at least ``min_idle``."""

    def __init__(self, saves: int, min_idle: int) -> None:
        self.saves, self.min_idle = saves, min_idle
        self.saved = 0
        self._busy_run = 0  # steps of the last busy window
        self._idle_run = 0  # idle steps since it ended
        self._was_busy = False

    def after_step(self, busy: bool, *, waiting: bool = False) -> str:
        """``"save"``, ``"stop"`` or ``""``. A ``waiting`` step (the control's save not yet
        being written back) counts in neither window and holds the next save back."""
        if waiting:
            self._idle_run, self._was_busy = 0, False
            return ""
        if busy:
            self._busy_run = self._busy_run + 1 if self._was_busy else 1
            self._idle_run = 0
        else:
            self._idle_run += 1
        self._was_busy = busy
        if busy or self._idle_run < max(self.min_idle, self._busy_run):
            return ""
        if self.saved == self.saves:
            return "stop"
        self.saved += 1
        self._busy_run = self._idle_run = 0
        return "save"


def cycles(steps: Sequence[Step]) -> list[Cycle]:
    """The (busy, idle) windows in order; the steps before the first busy one (warm-up) and a
    busy window with no idle one after it are left out."""
    out: list[Cycle] = []
    busy: list[float] = []
    idle: list[float] = []
    for seconds, is_busy in steps:
        if is_busy:
            if idle and busy:
                out.append((busy, idle))
                busy, idle = [], []
            elif idle:  # warm-up before the first save
                idle = []
            busy.append(seconds)
        elif busy:
            idle.append(seconds)
    if busy and idle:
        out.append((busy, idle))
    return out


@dataclass(frozen=True)
class StepRatio:
    """Median busy step / median idle step, its bootstrap 95 % interval, and the counts."""

    ratio: float
    low: float
    high: float
    busy: int
    idle: int
    cycles: int

    def __str__(self) -> str:
        return (
            f"{self.ratio:.3f}x [{self.low:.3f}, {self.high:.3f}] "
            f"({self.busy}/{self.idle} in {self.cycles})"
        )


Centre = Callable[[Sequence[float]], float]


def _ratio(chosen: Sequence[Cycle], centre: Centre = statistics.median) -> float:
    busy = [s for b, _ in chosen for s in b]
    idle = [s for _, i in chosen for s in i]
    return centre(busy) / centre(idle)


def step_ratio(
    steps: Sequence[Step], reps: int = 2000, seed: int = 0, centre: Centre = statistics.median
) -> StepRatio | None:
    """The ratio with its interval (None without a full cycle). ``centre``: the median (the
    typical step), or ``statistics.fmean`` (the run's throughput: it counts the long steps a
    preemption makes, which the median leaves out)."""
    found = cycles(steps)
    return _bootstrap(found, None, reps, seed, centre) if found else None


def relative_ratio(
    steps: Sequence[Step], control: Sequence[Step], reps: int = 2000, seed: int = 0,
    centre: Centre = statistics.median,
) -> StepRatio | None:  # fmt: skip
    """One run's step ratio over a control run's (busy / idle each), with a 95 % interval from
    bootstrapping both runs' cycles independently: what a finish costs the step beyond what the
    kernel's own write-back of the same save costs it. None without a cycle in either."""
    found, base = cycles(steps), cycles(control)
    return _bootstrap(found, base, reps, seed, centre) if found and base else None


def _bootstrap(
    found: list[Cycle], base: list[Cycle] | None, reps: int, seed: int, centre: Centre
) -> StepRatio:
    """``found``'s ratio (over ``base``'s, when given) and its interval from ``reps`` resamples
    of whole cycles."""
    rng = random.Random(seed)

    def ratio(a: Sequence[Cycle], b: Sequence[Cycle] | None) -> float:
        return _ratio(a, centre) / (1.0 if b is None else _ratio(b, centre))

    def resample(cs: list[Cycle]) -> list[Cycle]:
        return rng.choices(cs, k=len(cs))

    samples = sorted(ratio(resample(found), base and resample(base)) for _ in range(reps))
    return StepRatio(
        ratio=ratio(found, base), low=samples[int(0.025 * reps)],
        high=samples[int(0.975 * reps) - 1], busy=sum(len(b) for b, _ in found),
        idle=sum(len(i) for _, i in found),
        cycles=len(found) if base is None else min(len(found), len(base)),
    )  # fmt: skip
