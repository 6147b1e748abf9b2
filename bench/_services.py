"""Services the benchmarks share: moto's SQS server (or LocalStack's) in its own process."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

_START_TIMEOUT_S = 30


@contextlib.contextmanager
def moto_process() -> Iterator[str]:
    """``moto_server`` in its own process on a free loopback port; yields its endpoint.

    SQS is remote in production: in-process, moto's request handling would compete for the
    benchmark's GIL and its cost would be charged to the client or the writer.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("moto_server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def sqs_process(kind: str = "moto") -> Iterator[str]:
    """The chosen SQS emulator (``moto`` or ``localstack``) in its own process; its endpoint."""
    if kind == "localstack":
        from ckpt_pipeline.local.localstack import localstack_sqs

        with localstack_sqs() as endpoint:
            yield endpoint
    else:
        with moto_process() as endpoint:
            yield endpoint
