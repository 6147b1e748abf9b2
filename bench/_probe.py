"""Where a training step's time goes, step by step: on a CPU, waiting for one, or neither.

Per step (~25 us): the training thread's CPU time (``CLOCK_THREAD_CPUTIME_ID``), its run-queue
wait (``/proc/thread-self/schedstat``), its user/system ticks, and the machine's ``/proc/stat`` by
kind (``nice``: the finisher's; ``system``: the kernel's and the kworkers'; ``steal``: the
hypervisor's). The rest of the step's wall time it was blocked. Outside Linux: empty samples.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Literal

State = Literal["busy", "idle", "waiting"]
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal (then guests), ticks.
STAT_KINDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# (on-CPU s, run-queue wait s, the thread's user s, its system s, then STAT_KINDS in s).
Trace = tuple[float, ...]
_OWN = 4  # the training thread's fields before the machine's
_TICK = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


class StepProbe:
    """Samples the calling thread (make it on the training thread) and the machine."""

    def __init__(self) -> None:
        # /proc/thread-self resolves to the thread that opens it; pread at 0 re-reads a seq file.
        self._sched = _open("/proc/thread-self/schedstat")
        self._stat = _open("/proc/stat")
        self._ticks = _open("/proc/thread-self/stat")
        self._last: tuple[float, ...] | None = None

    def _sample(self) -> tuple[float, ...] | None:
        if self._sched is None or self._stat is None or self._ticks is None:
            return None
        waited = os.pread(self._sched, 128, 0).split()[1]
        # Fields 14 and 15 (utime, stime), counted after the command's closing parenthesis.
        own = os.pread(self._ticks, 1024, 0).rsplit(b")", 1)[1].split()[11:13]
        cpu = os.pread(self._stat, 256, 0).split(b"\n", 1)[0].split()[1 : 1 + len(STAT_KINDS)]
        return (
            time.thread_time(),
            int(waited) / 1e9,
            *(int(t) * _TICK for t in own),
            *(int(t) * _TICK for t in cpu),
        )

    def begin(self) -> None:
        """A step starts."""
        self._last = self._sample()

    def end(self) -> Trace:
        """The step ended: its deltas (empty where nothing could be read)."""
        now, last = self._sample(), self._last
        if now is None or last is None:
            return ()
        return tuple(b - a for a, b in zip(last, now, strict=True))

    def close(self) -> None:
        """Close the files it reads."""
        for fd in (self._sched, self._stat, self._ticks):
            if fd is not None:
                os.close(fd)
        self._sched = self._stat = self._ticks = None


def combine(first: State, last: State) -> State:
    """A step's state from the states at its start and its end: busy if either was."""
    if "busy" in (first, last):
        return "busy"
    return "waiting" if "waiting" in (first, last) else "idle"


def _mean_ms(values: Sequence[float]) -> str:
    return f"{1000 * statistics.fmean(values):.2f}" if values else "-"


def summary(steps: Sequence[tuple[float, bool]], traces: Sequence[Trace]) -> str:
    """Busy / idle: the training thread's mean wall, on-CPU, run-queue wait and blocked ms per
    step (means, so that the three parts add up to the wall time), and the machine's CPU time
    by kind as a share of all its CPU time in those steps."""
    columns: dict[bool, list[list[float]]] = {True: [[], [], [], []], False: [[], [], [], []]}
    machine = {True: [0.0] * len(STAT_KINDS), False: [0.0] * len(STAT_KINDS)}
    kernel = {True: [0.0, 0.0], False: [0.0, 0.0]}  # the thread's (user, system) seconds
    for (wall, busy), trace in zip(steps, traces, strict=True):
        if not trace:
            continue
        on_cpu, waited = trace[0], trace[1]
        blocked = max(0.0, wall - on_cpu - waited)
        for column, value in zip(columns[busy], (wall, on_cpu, waited, blocked), strict=True):
            column.append(value)
        kernel[busy][0] += trace[2]
        kernel[busy][1] += trace[3]
        for i, seconds in enumerate(trace[_OWN:]):
            machine[busy][i] += seconds
    if not columns[True][0] or not columns[False][0]:
        return "trace: -"
    names = ("wall", "on-CPU", "run-queue wait", "blocked")
    per_step = ", ".join(
        f"{name} {_mean_ms(columns[True][i])} / {_mean_ms(columns[False][i])}"
        for i, name in enumerate(names)
    )
    busy_total, idle_total = sum(machine[True]) or 1.0, sum(machine[False]) or 1.0
    shares = ", ".join(
        f"{kind} {100 * machine[True][i] / busy_total:.0f} / "
        f"{100 * machine[False][i] / idle_total:.0f}"
        for i, kind in enumerate(STAT_KINDS)
    )
    in_kernel = " / ".join(
        f"{100 * k[1] / (sum(k) or 1.0):.0f}" for k in (kernel[True], kernel[False])
    )
    return (
        f"trace busy / idle (mean ms a step): {per_step}; the thread's CPU in the kernel %:"
        f" {in_kernel}; machine CPU % busy / idle: {shares}"
    )


class StepClock:
    """Times each step and records it with its trace and whether the finisher (or, in the
    controls, the kernel's write-back) was busy at its start or end; a ``waiting`` step (the
    control's save still dirty, its write-back not begun) is left out of both windows. The
    state is read outside the timed span: the controls' look at the page cache costs time."""

    def __init__(
        self, steps: list[tuple[float, bool]], traces: list[Trace], state: Callable[[], State]
    ) -> None:
        self._steps, self._traces, self._state = steps, traces, state
        self._probe = StepProbe()
        self._first: State = "idle"
        self._start = 0.0

    def begin(self) -> None:
        """A step starts (on the training thread)."""
        self._first = self._state()
        self._probe.begin()
        self._start = time.perf_counter()

    def end(self) -> State:
        """The step ended: recorded unless waiting; its state returned (for the cadence)."""
        wall = time.perf_counter() - self._start
        trace = self._probe.end()
        state = combine(self._first, self._state())
        if state != "waiting":
            self._steps.append((wall, state == "busy"))
            self._traces.append(trace)
        return state
