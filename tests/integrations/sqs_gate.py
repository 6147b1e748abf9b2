"""A TCP relay between one rank's SQS client and moto that the rank can freeze: from then on no
request byte reaches SQS, so a report spooled after the freeze is on disk and never sent (the
state a SIGKILL right after a save leaves). boto3 routes only SQS through it
(``AWS_ENDPOINT_URL_SQS``); S3 uploads keep going to moto directly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from urllib.parse import urlparse

import psycopg

from trainer_client import CheckpointReporter


class SqsGate:
    """Listens on a free local port and relays every connection to ``upstream_url``."""

    def __init__(self, upstream_url: str) -> None:
        parsed = urlparse(upstream_url)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.frozen = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def route_sqs_here(self) -> None:
        """Point this process's boto3 SQS clients (built after this call) at the relay."""
        os.environ["AWS_ENDPOINT_URL_SQS"] = self.url

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            upstream = socket.create_connection(self._upstream)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, to_sqs: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                while to_sqs and self.frozen.is_set():
                    time.sleep(0.05)  # held until the process dies
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def shard_stored(database_url: str, step: int, rank: int) -> bool:
    """Whether the writer has stored ``rank``'s report of ``step`` for this process's job: the
    kill scenarios freeze a rank only once another rank's report of the step is in."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT 1 FROM training_checkpoint_shards"
            " WHERE job_id = %s AND step = %s AND rank = %s",
            (os.environ["CKPT_JOB_ID"], step, rank),
        ).fetchone()
    return row is not None


def die_when_spooled(reporter: CheckpointReporter, step: int, database_url: str) -> None:
    """After the save of ``step`` returned and was handed to the reporter: once its report is
    spooled and rank 0's is in the database, SIGKILL this process."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if reporter.pending >= 1 and shard_stored(database_url, step, 0):
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2)
    raise RuntimeError(f"step {step}: report not spooled or rank 0's not stored in 120 s")
