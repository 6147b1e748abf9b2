"""Driving :mod:`tests.e2e.rank_child` processes: start one, read its lines with a deadline."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.trainer_client.helpers import REPO_ROOT, child_env

LINE_TIMEOUT_S = 60.0


def start_rank(args: dict[str, Any], *, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    """Start one rank process; its stderr (logs) goes to ``log``, its stdout is read by lines."""
    with log.open("a") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.rank_child", json.dumps(args)],
            env=child_env(**env),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )


def next_line(proc: subprocess.Popen[str], timeout: float = LINE_TIMEOUT_S) -> str | None:
    """The child's next line, or None once it exited; fails if it stays silent too long."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            raise AssertionError(f"rank process silent for {timeout} s")
    line = proc.stdout.readline()
    return line.strip() if line else None


def wait_line(
    proc: subprocess.Popen[str], prefix: str, timeout: float = LINE_TIMEOUT_S
) -> str | None:
    """Read lines until one starts with ``prefix`` (returned) or the child exits (None)."""
    deadline = time.monotonic() + timeout
    while True:
        line = next_line(proc, max(0.1, deadline - time.monotonic()))
        if line is None or line.startswith(prefix):
            return line
