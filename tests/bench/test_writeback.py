"""bench._writeback, the control's view of the kernel's write-back of a save, on the real page
cache: a file written is waiting (or already being written back, if the machine's dirty pages
are over the background threshold), and idle once the kernel has written it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench._writeback import KernelWriteBack, dirty_pages

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="cachestat and syncfs: Linux")


def _written(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_a_saved_file_waits_for_the_kernel_then_is_idle(tmp_path: Path) -> None:
    # GIVEN a file of 8 MiB just written, and the control following it
    path = _written(tmp_path / "ckpt.pt", 8 << 20)
    watch = KernelWriteBack(now=False)
    watch.saved([path])
    # THEN it was dirty at the save and is not idle before the kernel writes it
    assert watch.dirty_at_save[0] > 0
    assert watch.state() in ("waiting", "busy")
    # WHEN the file is written back
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    # THEN its pages are clean and the control says idle
    assert dirty_pages(fd) == (0, 0)
    os.close(fd)
    assert watch.state() == "idle"
    watch.close()


def test_control_now_asks_the_kernel_at_once_and_is_busy_until_it_is_written(
    tmp_path: Path,
) -> None:
    # GIVEN a file just written, followed by control-now (syncfs on a thread of its own)
    path = _written(tmp_path / "ckpt.pt", 8 << 20)
    watch = KernelWriteBack(now=True)
    watch.saved([path])
    # WHEN the kernel's write-back ends (close waits for it)
    watch.close()
    # THEN the file is clean, never "waiting"
    fd = os.open(path, os.O_RDONLY)
    assert dirty_pages(fd) == (0, 0)
    os.close(fd)
    assert watch.dirty_at_save[0] > 0
