"""The work dir of ``bench.save_overhead``: removed however the bench ends, short of SIGKILL.

A run keeps every checkpoint it saved until its reports are checked (55 GB for 55 cycles at
1 GB), so a bench stopped by a timeout's SIGTERM must not leave them: it once filled the disk.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "save-overhead-"
_OWN_ROOT = re.compile(rf"{PREFIX}(\d+)-")


def remove_orphan_roots(parent: Path) -> list[Path]:
    """Remove the work dirs under ``parent`` of bench processes that no longer exist (one
    killed by SIGKILL, which no handler sees); those of live processes are left alone."""
    removed = []
    for path in parent.glob(f"{PREFIX}*-*"):
        found = _OWN_ROOT.match(path.name)
        if found is None or not path.is_dir() or path.stat().st_uid != os.getuid():
            continue
        try:
            os.kill(int(found[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except PermissionError:  # alive, another user's
            continue
    return removed


def _exit_on_signal(signum: int, frame: object) -> None:
    # SystemExit unwinds the run as an error does, so every `finally` removes its checkpoints
    # (Lightning's own SIGTERM handler calls this one after its own; HF installs none).
    raise SystemExit(128 + signum)


@contextmanager
def work_root(given: Path | None) -> Iterator[Path]:
    """The dir the runs write their checkpoints under: ``given`` (each run removes its own dir
    in it; the dir stays) or a fresh ``$TMPDIR/save-overhead-<pid>-*`` (removed whole), also on
    SIGTERM (made a SystemExit here) and SIGINT (Python's KeyboardInterrupt)."""
    if given is None:
        parent = Path(tempfile.gettempdir())
        remove_orphan_roots(parent)
        root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent))
    else:
        root = given
    # Only the main thread may install a handler (a test may call main() from another).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_signal) if main_thread else None
    try:
        yield root
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if given is None:
            shutil.rmtree(root, ignore_errors=True)
