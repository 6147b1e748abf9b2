"""CPU seconds of the parts of a local run, read from /proc (Linux): whose CPU the cores went to."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its reaped children; 0.0 if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # Fields after the command (which may contain spaces) start at index 2 = field 3.
    fields = stat.rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICKS


def machine_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of all cores since boot (/proc/stat's first line)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq) / _TICKS, steal / _TICKS


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``, its reaped children and its live children (PostgreSQL: the
    postmaster and its backends). A child that exits between two readings moves from the live
    sum into the parent's reaped share, so differences of two readings stay whole."""
    total = process_cpu_s(pid)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            total += process_cpu_s(int(proc.name))
    return total


def postmaster_pid(data_dir: Path) -> int | None:
    """The postmaster of the cluster in ``data_dir`` (first line of postmaster.pid)."""
    try:
        return int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def listening_pid(port: int) -> int | None:
    """The process with a TCP socket listening on 127.0.0.1:``port`` (the emulator's)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    wanted = {f"socket:[{i}]" for i in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if str(fd.readlink()) in wanted:
                    return int(proc.name)
        except OSError:
            continue
    return None


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds of each part of a local run over one span, and of the whole machine.

    Whose CPU the 2 shared cores went to: the simulated ranks (their reporters: spool, sender,
    boto3), the event source (the bench's process, less the writer's handler threads; it
    includes the bench's own polling), the writer's handler threads, the throwaway cluster
    (postmaster and backends) and the emulator's process. NaN where a part's process was not
    found.
    """

    wall_s: float
    ranks_s: float
    source_s: float
    writer_s: float
    postgres_s: float
    emulator_s: float
    busy_s: float
    steal_s: float

    def busy_share(self, cores: int) -> float:
        return self.busy_s / (cores * self.wall_s) if self.wall_s > 0 else math.nan


class WriterCpu:
    """CPU seconds the writer's handlers spent, summed over its workers: pass :meth:`add` as
    ``local_pipeline``'s ``on_done`` (each invocation's own thread CPU)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, result: object, cpu_s: float) -> None:
        with self._lock:
            self.seconds += cpu_s


class PartsCpu:
    """Reads the CPU counters of the parts of a local pipeline that run outside the rank
    processes (whose own CPU they report themselves): two readings make a :class:`CpuSplit`."""

    def __init__(
        self, endpoint: str, postgres_data_dir: Path, writer_s: Callable[[], float]
    ) -> None:
        self._emulator = listening_pid(int(endpoint.rsplit(":", 1)[1]))
        self._postgres = postmaster_pid(postgres_data_dir)
        self._writer_s = writer_s

    def read(self) -> tuple[float, ...]:
        busy, steal = machine_cpu_s()
        return (
            time.monotonic(),
            time.process_time(),
            self._writer_s(),
            tree_cpu_s(self._postgres) if self._postgres else math.nan,
            process_cpu_s(self._emulator) if self._emulator else math.nan,
            busy,
            steal,
        )

    @staticmethod
    def split(before: tuple[float, ...], after: tuple[float, ...], ranks_s: float) -> CpuSplit:
        wall, here, writer, postgres, emulator, busy, steal = (
            b - a for a, b in zip(before, after, strict=True)
        )
        return CpuSplit(
            wall_s=wall, ranks_s=ranks_s, source_s=here - writer, writer_s=writer,
            postgres_s=postgres, emulator_s=emulator, busy_s=busy, steal_s=steal,
        )  # fmt: skip
