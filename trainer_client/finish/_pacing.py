"""How the finisher shares the machine with training: priorities, a bandwidth cap, a pause while
a step is in flight, the cores left idle, and the page cache given back.

All of it is Linux's: thread priorities through ``sched_setscheduler``/``setpriority`` and the
``ioprio_set`` system call (no Python wrapper; through libc's ``syscall``), the cache through
``posix_fadvise``. Elsewhere every call here does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from trainer_client.config import Priority

# include/uapi/linux/ioprio.h: the class in the top bits, the level (0 highest .. 7) below.
_IOPRIO_CLASS_SHIFT = 13
_IOPRIO_CLASS_BE, _IOPRIO_CLASS_IDLE = 2, 3
_IOPRIO_WHO_PROCESS = 1  # with a thread id: that thread only
_SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
# Most threads a job's hashing starts when it measures the idle cores (8 MiB of memory each).
MAX_AUTO_HASH_THREADS = 8


def libc() -> ctypes.CDLL | None:
    """The C library (for the calls Python does not wrap), or None where there is none."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = libc()


def _set_io_priority(tid: int, klass: int, level: int) -> None:
    number = _SYS_IOPRIO_SET.get(platform.machine())
    if _LIBC is None or number is None:
        return
    _LIBC.syscall(number, _IOPRIO_WHO_PROCESS, tid, (klass << _IOPRIO_CLASS_SHIFT) | level)


def thread_nice() -> int:
    """The calling thread's nice value (Linux's is per thread); 0 where it cannot be read."""
    if not hasattr(os, "getpriority"):
        return 0
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except OSError:
        return 0


def lower_thread_priority(priority: Priority, nice: int, base_nice: int | None = None) -> None:
    """Make the calling thread yield to training.

    ``idle``: SCHED_IDLE (the CPU only when no other thread wants it) and the idle I/O class
    (the disk only when nothing else uses it); ``low``: nice ``base_nice + nice`` (at most 19)
    and the lowest best-effort I/O level; ``normal``: unchanged. ``base_nice`` is the training's
    (the thread that built the reporter); None: the calling thread's own. It must be given to a
    thread started by an already lowered one: Linux threads inherit their creator's nice, so
    adding ``nice`` to that again put the hash threads at 19 instead of 10. The I/O class counts
    where the block layer's scheduler honours it (mq-deadline, BFQ) and for the write-back the
    thread itself issues (the finisher's ``sync_file_range``/fsync, its reads); not for the
    kernel's flusher.
    """
    if priority == "normal" or not hasattr(os, "sched_setscheduler"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        if priority == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            _set_io_priority(tid, _IOPRIO_CLASS_IDLE, 0)
            return
        base = thread_nice() if base_nice is None else base_nice
        target = min(19, base + nice)
        # Only ever lowered: raising a thread's priority is not ours to do (nor allowed without
        # CAP_SYS_NICE).
        if target > thread_nice():
            os.setpriority(os.PRIO_PROCESS, tid, target)
        _set_io_priority(tid, _IOPRIO_CLASS_BE, 7)


class StepSignal:
    """Whether a training step is in flight, as the integrations say (the HF callback's
    ``on_step_begin``/``on_step_end``, Lightning's ``on_train_batch_start``/``_end``)."""

    def __init__(self) -> None:
        self._outside = threading.Event()
        self._outside.set()

    def began(self) -> None:
        """A step started on the training thread."""
        self._outside.clear()

    def ended(self) -> None:
        """The step ended."""
        self._outside.set()

    def wait_outside(self, timeout: float) -> bool:
        """Wait until no step is in flight, at most ``timeout`` seconds; False at the timeout."""
        return self._outside.wait(timeout)


class Pacer:
    """Called by the finisher after each slice it writes back and each chunk it hashes (from
    several threads): keeps the job under ``max_bandwidth`` bytes/s and, with ``step_pause_s``,
    waits up to that long for a training step in flight to end. Sleeps end early at ``stop``."""

    def __init__(
        self,
        *,
        max_bandwidth: float | None,
        step_pause_s: float,
        steps: StepSignal,
        stop: threading.Event,
    ) -> None:
        self._bandwidth, self._pause, self._steps, self._stop = (
            max_bandwidth,
            step_pause_s,
            steps,
            stop,
        )
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._bytes = 0
        self.paused_s = 0.0

    def __call__(self, nbytes: int) -> None:
        if self._bandwidth is not None:
            with self._lock:
                self._bytes += nbytes
                due = self._start + self._bytes / self._bandwidth
            ahead = due - time.monotonic()
            if ahead > 0:
                self._stop.wait(ahead)
        if self._pause > 0:
            start = time.monotonic()
            self._steps.wait_outside(self._pause)
            with self._lock:
                self.paused_s += time.monotonic() - start


class IdleCores:
    """The CPUs of this process's affinity that stayed idle since the previous look (per-CPU
    idle and iowait time in ``/proc/stat``): what training and everything else left unused."""

    def __init__(self) -> None:
        self._last = self._sample()

    @staticmethod
    def _sample() -> tuple[float, int] | None:
        try:
            cpus = {f"cpu{c}" for c in os.sched_getaffinity(0)}
            with Path("/proc/stat").open(encoding="ascii") as f:
                lines = [line.split() for line in f if line.startswith("cpu")]
        except (OSError, AttributeError):
            return None
        # Fields: user nice system idle iowait ...; in USER_HZ ticks.
        idle = sum(int(p[4]) + int(p[5]) for p in lines if p[0] in cpus and len(p) > 5)
        return time.monotonic(), idle

    def restart(self) -> None:
        """Start the next measurement now."""
        self._last = self._sample()

    def take(self) -> int:
        """Whole cores left idle since the last call (at least 1, at most
        ``MAX_AUTO_HASH_THREADS``); 1 where it cannot be measured."""
        now, last = self._sample(), self._last
        self._last = now
        if now is None or last is None or now[0] - last[0] < 0.05:
            return 1
        ticks = (now[1] - last[1]) / os.sysconf("SC_CLK_TCK")
        return max(1, min(MAX_AUTO_HASH_THREADS, int(ticks / (now[0] - last[0]))))


def drop_from_cache(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Tell the kernel the files' (clean, durable) pages are not needed again, so a checkpoint
    does not push the training data out of the page cache. Best effort."""
    if not hasattr(os, "posix_fadvise"):
        return
    for path in paths:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
