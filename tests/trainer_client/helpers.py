"""Test helpers for the trainer client: a restartable moto server, queue draining, child runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from moto.server import ThreadedMotoServer

from tests.torchrun import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class RestartableMoto:
    """moto's server on one fixed port that can be stopped and started again (state is kept:
    moto's backends live in this process, not in the server object)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server: ThreadedMotoServer | None = None

    def start(self) -> None:
        """Serve on the fixed port."""
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        """Stop serving; connections are refused until start()."""
        if self._server is not None:
            self._server.stop()
            self._server = None


def read_until(
    read: Callable[[], T], done: Callable[[T], bool], *, timeout: float, interval: float
) -> T:
    """Call ``read`` until ``done`` holds for what it returned or ``timeout`` seconds passed; the
    last value either way, so that the caller's assertion on it says what differs."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds."""
    value = read_until(condition, bool, timeout=timeout, interval=interval)
    if not value:
        raise AssertionError(f"condition not met within {timeout} s")
    return value


def rows_until(
    database_url: str,
    query: str,
    done: Callable[[list[tuple[Any, ...]]], bool],
    *,
    timeout: float = 60.0,
) -> list[tuple[Any, ...]]:
    """``query``'s rows once ``done`` holds for them, or as they are after ``timeout`` seconds:
    a report acknowledged by SQS is written a moment later, so the rows decide, not the queue."""
    import psycopg

    def read() -> list[tuple[Any, ...]]:
        with psycopg.connect(database_url) as conn:
            return conn.execute(query).fetchall()

    return read_until(read, done, timeout=timeout, interval=0.5)


def drain(sqs: Any, queue_url: str, *, expect: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Receive and delete until ``expect`` messages arrived and the queue is empty.

    Deleting is needed because FIFO hides a group's later messages while earlier ones are in
    flight; it also means moto no longer deduplicates against them, so any resend would show.
    """
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=600,
            WaitTimeSeconds=0,
            MessageSystemAttributeNames=["All"],
        )
        batch = response.get("Messages", [])
        messages.extend(batch)
        for message in batch:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        if not batch:
            if len(messages) >= expect:
                return messages
            time.sleep(0.05)
    return messages


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child Python process that imports this repository."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def start_child(code: str, **env: str) -> subprocess.Popen[str]:
    """Run ``code`` in a fresh Python interpreter, stdout/stderr captured as text."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=child_env(**env),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_child(
    code: str, *args: str, timeout: float, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``args`` in a fresh Python interpreter to the end, output captured."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=child_env(**env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def read_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The next line the child prints (it must flush); fails if it exits first."""
    assert proc.stdout is not None
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError("child printed nothing in time")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(
            f"child exited: rc={proc.wait()} stderr={proc.stderr.read() if proc.stderr else ''}"
        )
    return line.strip()
