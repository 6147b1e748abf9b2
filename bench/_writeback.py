"""The control for ``bench.save_overhead``: the same save with no finisher, its dirty pages
written back by the kernel alone, and which steps ran during that write-back.

``control`` leaves the write-back to the kernel's flusher (after ``vm.dirty_expire_centisecs``);
``control-now`` calls ``syncfs`` at once from a bench thread. A step is *busy* from the first page
written back to the last (``cachestat``, Linux 6.5, read outside the timed steps), *waiting*
(left out) while the pages are dirty and none written yet. Nothing of ours runs.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Sequence
from pathlib import Path

from bench._probe import State

CONTROLS = ("control", "control-now")
_SYS_CACHESTAT = 451  # the same number on x86_64 and aarch64 (new syscalls are unified)
_SYS_SYNCFS = {"x86_64": 306, "aarch64": 267}
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")
    ]


_LIBC = ctypes.CDLL(None, use_errno=True)


class ControlUnavailable(RuntimeError):
    """The control needs Linux's ``cachestat`` (6.5+) and ``syncfs``."""


def _cachestat(fd: int) -> _Stat:
    stat, whole = _Stat(), _Range(0, 0)
    if _LIBC.syscall(_SYS_CACHESTAT, fd, ctypes.byref(whole), ctypes.byref(stat), 0) != 0:
        err = ctypes.get_errno()
        raise ControlUnavailable(f"cachestat: {os.strerror(err)} (the control needs Linux 6.5+)")
    return stat


def dirty_pages(fd: int) -> tuple[int, int]:
    """(dirty, under write-back) pages of the open file ``fd``."""
    stat = _cachestat(fd)
    return stat.dirty, stat.writeback


def cached_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return int(_cachestat(fd).cache)
    finally:
        os.close(fd)


class KernelWriteBack:
    """Tracks the last save's files through the kernel's write-back (see the module's text)."""

    def __init__(self, *, now: bool) -> None:
        if platform.system() != "Linux" or (now and platform.machine() not in _SYS_SYNCFS):
            raise ControlUnavailable("the control modes run on Linux (x86_64, aarch64) only")
        self._now = now
        self._fds: list[int] = []
        self._at_save = 0
        self._started = False
        self._sync: threading.Thread | None = None
        self.dirty_at_save: list[int] = []  # bytes dirty or under write-back right after each save

    def _pages(self) -> tuple[int, int]:
        counts = [dirty_pages(fd) for fd in self._fds]
        return sum(d for d, _ in counts), sum(w for _, w in counts)

    def saved(self, paths: Sequence[Path]) -> None:
        """A save returned: follow ``paths`` (the last save's are dropped)."""
        self.close()
        self._fds = [os.open(p, os.O_RDONLY) for p in paths]
        self._at_save, self._started = sum(self._pages()), False
        self.dirty_at_save.append(self._at_save * _PAGE)
        if self._now and self._at_save:
            fd = self._fds[0]
            self._sync = threading.Thread(
                target=lambda: _LIBC.syscall(_SYS_SYNCFS[platform.machine()], fd),
                name="control-syncfs",
                daemon=True,
            )
            self._sync.start()

    def state(self) -> State:
        """``busy`` while the kernel writes the save back, ``waiting`` while it is dirty but
        untouched, ``idle`` once it is clean."""
        if self._sync is not None:
            if self._sync.is_alive():
                return "busy"
            self._sync = None
        dirty, writeback = self._pages()
        if dirty + writeback == 0:
            return "idle"
        if writeback or dirty + writeback < self._at_save:
            self._started = True
        return "busy" if self._started or self._now else "waiting"

    def close(self) -> None:
        """Stop following the files (a write-back under way goes on)."""
        if self._sync is not None:
            self._sync.join()
            self._sync = None
        for fd in self._fds:
            os.close(fd)
        self._fds = []
