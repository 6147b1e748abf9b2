"""Run-wide test services: one process for the whole pytest run, however many xdist workers.

A session fixture lives once per process, so under pytest-xdist every worker would start its own
LocalStack (each start imports LocalStack's whole runtime: seconds of CPU on 2 cores). Here the
first process that needs a service starts it under a file lock in the run's shared directory
(pytest-xdist's pattern for session fixtures that must run once,
https://pytest-xdist.readthedocs.io/en/stable/how-to.html#making-session-scoped-fixtures-execute-only-once)
and records its endpoint there; the others read it. The service runs inside a small keeper
process (``python -m tests.run_wide NAME STATE OWNER_PID``) that holds it in its context manager:
the run's controller stops every keeper when the run ends (:func:`stop_all`), and a keeper whose
controller died stops its service by itself, so nothing outlives a killed run for long.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from filelock import FileLock

RUN_DIR_VAR = "CKPT_TEST_RUN_DIR"
OWNER_VAR = "CKPT_TEST_RUN_PID"
REPO_ROOT = Path(__file__).resolve().parents[1]
# LocalStack's own start allows 90 s and retries a lost port race twice; wait a bit beyond that.
_START_WAIT_S = 300.0
_STOP_WAIT_S = 20.0


class RunWideServiceError(RuntimeError):
    """A run-wide service did not start (its keeper's error, or no answer in time)."""


def begin_run() -> Path:
    """Called once by the run's controller (the only process without xdist): a fresh directory
    for the run's shared state, named in the environment the workers inherit."""
    run_dir = Path(tempfile.mkdtemp(prefix="ckpt-test-run-"))
    os.environ[RUN_DIR_VAR] = str(run_dir)
    os.environ[OWNER_VAR] = str(os.getpid())
    return run_dir


def _service(name: str) -> AbstractContextManager[str]:
    """The context manager of each run-wide service; yields its endpoint."""
    if name == "localstack":
        from ckpt_pipeline.local.localstack import localstack_sqs

        # SQS and S3 in one instance: the tests of both use fresh uniquely named queues/buckets.
        return localstack_sqs(service="sqs,s3")
    raise ValueError(f"unknown run-wide service {name!r}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def endpoint(name: str) -> str:
    """The endpoint of run-wide service ``name``, started by the first caller of the run."""
    run_dir = Path(os.environ[RUN_DIR_VAR])
    state = run_dir / f"{name}.json"
    with FileLock(str(run_dir / f"{name}.lock")):
        if not state.exists():
            _start(name, state, int(os.environ[OWNER_VAR]))
        data = json.loads(state.read_text())
    if "error" in data:
        raise RunWideServiceError(f"{name}: {data['error']}")
    return str(data["endpoint"])


def _start(name: str, state: Path, owner: int) -> None:
    """Spawn the keeper of ``name`` and wait until it wrote ``state`` (endpoint or error)."""
    log = state.with_suffix(".log")
    with log.open("ab") as out:
        keeper = subprocess.Popen(
            [sys.executable, "-m", "tests.run_wide", name, str(state), str(owner)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Its own session: a ^C in the terminal reaches the controller, which stops it.
            start_new_session=True,
        )
    deadline = time.monotonic() + _START_WAIT_S
    while not state.exists():
        if keeper.poll() is not None and not state.exists():
            _write_atomically(state, {"error": f"keeper exited {keeper.returncode}: {_tail(log)}"})
            return
        if time.monotonic() > deadline:
            keeper.terminate()
            _write_atomically(state, {"error": f"no endpoint after {_START_WAIT_S:.0f} s"})
            return
        time.sleep(0.1)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_all(run_dir: Path) -> None:
    """Stop every keeper recorded in ``run_dir`` (the controller, at the end of the run) and wait
    for each to finish stopping its service."""
    keepers: list[int] = []
    for state in run_dir.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            pid = json.loads(state.read_text()).get("keeper")
            if isinstance(pid, int):
                keepers.append(pid)
    for pid in keepers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_WAIT_S
    while any(_alive(pid) for pid in keepers) and time.monotonic() < deadline:
        time.sleep(0.1)


def _keep(name: str, state: Path, owner: int) -> None:
    """The keeper: run the service until SIGTERM or until ``owner`` (the controller) is gone."""

    def stop(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        with _service(name) as url:
            _write_atomically(state, {"endpoint": url, "keeper": os.getpid()})
            while _alive(owner):
                time.sleep(0.5)
    except Exception as exc:
        if not state.exists():
            _write_atomically(state, {"error": f"{type(exc).__name__}: {exc}"})
        raise


if __name__ == "__main__":
    _keep(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
