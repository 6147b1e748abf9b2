"""CPU seconds of the parts of a local run, read from /proc (Linux): whose CPU the cores went to."""

from __future__ import annotations

import os
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
