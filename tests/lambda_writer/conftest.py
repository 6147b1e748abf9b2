"""Writer fixtures: real SQS event shapes from moto, the handler pointed at a real database."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.local.sqs_events import receive_kwargs, sqs_event
from ckpt_pipeline.local.sqs_server import PipelineQueues
from lambda_writer import WriterSettings
from tests.lambda_writer.helpers import EventFactory, Outgoing, environment


@pytest.fixture
def make_event(sqs: Any, pipeline_queues: PipelineQueues) -> EventFactory:
    """Send real messages to moto's FIFO queue, receive them, and build Lambda's SQS event."""

    def build(messages: Sequence[Outgoing | str]) -> dict[str, Any]:
        outgoing = [m if isinstance(m, Outgoing) else Outgoing(m) for m in messages]
        for m in outgoing:
            sqs.send_message(
                QueueUrl=pipeline_queues.queue_url,
                MessageBody=m.body,
                MessageGroupId=m.group_id,
                MessageDeduplicationId=m.dedup_id or uuid.uuid4().hex,
            )
        received: list[dict[str, Any]] = []
        while len(received) < len(outgoing):
            got = sqs.receive_message(
                QueueUrl=pipeline_queues.queue_url,
                **receive_kwargs(
                    max_messages=min(10, len(outgoing) - len(received)),
                    wait_time_s=1,
                    visibility_timeout_s=600,
                ),
            ).get("Messages", [])
            assert got, f"moto returned {len(received)} of {len(outgoing)} messages"
            received.extend(got)
        # Acknowledge at once (as the event source does after a batch) so the FIFO groups are
        # free for the test's next event; the handler only ever sees the event.
        for message in received:
            sqs.delete_message(
                QueueUrl=pipeline_queues.queue_url, ReceiptHandle=message["ReceiptHandle"]
            )
        return sqs_event(received, queue_arn=pipeline_queues.queue_arn)

    return build


@pytest.fixture
def writer_settings(clean_db: str, pipeline_queues: PipelineQueues) -> WriterSettings:
    """The writer's settings for the clean test DB and this test's DLQ."""
    return WriterSettings(database_url=clean_db, dlq_url=pipeline_queues.dlq_url)


@pytest.fixture
def writer_env(writer_settings: WriterSettings) -> Iterator[str]:
    """One execution environment over ``writer_settings`` (``invoke`` calls it); the DB's URL."""
    assert writer_settings.database_url is not None
    with environment(writer_settings):
        yield writer_settings.database_url


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def pgbouncer_port(database_url: str) -> Iterator[int]:
    """PgBouncer in transaction pooling mode in front of the test server (RDS Proxy's stand-in).

    One server connection per (db, user) pool, so concurrent clients really share it.
    """
    binary = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None
    )
    if binary is None:
        pytest.skip(
            "pgbouncer is not installed, so the RDS Proxy stand-in tests cannot run:"
            " run `bash .ci/setup-pgbouncer.sh` (installs it as root with apt-get)"
        )
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="ckpt-pgbouncer-"))
    (workdir / "userlist.txt").write_text('"postgres" ""\n"ckpt_writer" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"""[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir / "userlist.txt"}
pool_mode = transaction
default_pool_size = 1
max_client_conn = 50
server_reset_query =
logfile = {workdir / "pgbouncer.log"}
pidfile = {workdir / "pgbouncer.pid"}
"""
    )
    command = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root; its files must belong to the user it runs as.
        user = pwd.getpwnam("postgres")
        for path in [workdir, *workdir.iterdir()]:
            os.chown(path, user.pw_uid, user.pw_gid)
        command = ["runuser", "-u", "postgres", "--", *command]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = psycopg.conninfo.make_conninfo(database_url, port=str(port))
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(url, connect_timeout=1, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = workdir / "pgbouncer.log"
                    raise RuntimeError(
                        f"pgbouncer did not start: {log.read_text() if log.exists() else ''}"
                    ) from None
                time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
