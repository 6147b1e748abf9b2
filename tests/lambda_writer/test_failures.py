"""Database outages, killed connections and timeouts: the batch is retried, nothing half-written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.local.tcp_relay import TcpRelay
from lambda_writer.shared.settings import WriterSettings
from lambda_writer.writer.batch import CheckpointWriter
from lambda_writer.writer.records import parse_event
from tests.lambda_writer.helpers import (
    EventFactory,
    Outgoing,
    all_rows,
    body,
    checkpoint_rows,
    current,
    dlq_messages,
    environment,
    invoke,
    shard_rows,
)


def _server_address(url: str) -> tuple[str, int]:
    """The (host, port) of the fixture's database server: the relay forwards there."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    return str(params.get("host") or "127.0.0.1"), int(str(params.get("port") or 5432))


def test_db_down_fails_every_valid_record_then_recovers(
    clean_db: str,
    make_event: EventFactory,
    sqs: Any,
    pipeline_queues: PipelineQueues,
) -> None:
    # GIVEN a writer whose database port is closed (connection refused)
    forwarder = TcpRelay(_server_address(clean_db))
    url = psycopg.conninfo.make_conninfo(clean_db, host="127.0.0.1", port=str(forwarder.port))
    event = make_event(
        [
            Outgoing(body(rank=0), group_id="job-a:0"),
            Outgoing("garbage", group_id="job-a:0"),
            Outgoing(body(rank=1), group_id="job-a:1"),
        ]
    )
    ids = [r["messageId"] for r in event["Records"]]
    settings = WriterSettings(database_url=url, dlq_url=pipeline_queues.dlq_url)
    try:
        with environment(settings):
            # WHEN the batch arrives: every valid record is retried; the poison reaches the DLQ
            assert invoke(event) == [ids[0], ids[2]]
            assert len(dlq_messages(sqs, pipeline_queues, 1)) == 1
            assert all_rows(clean_db) == ([], [])
            # WHEN the database is back: the same execution environment connects and writes
            forwarder.start()
            assert invoke(event) == []
            assert [s[2] for s in shard_rows(clean_db)] == [0, 1]
    finally:
        forwarder.stop()


def test_killed_connection_is_reopened(writer_env: str, make_event: EventFactory) -> None:
    # GIVEN a warm execution environment whose connection's backend was terminated
    assert invoke(make_event([body(rank=0)])) == []
    conn, _ = current().writer.connection.get()
    old_pid = conn.info.backend_pid
    with psycopg.connect(writer_env, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
    # WHEN the next batch arrives, THEN it is written over a fresh connection
    assert invoke(make_event([body(rank=1)])) == []
    conn, reused = current().writer.connection.get()
    assert reused and conn.info.backend_pid != old_pid
    assert [s[2] for s in shard_rows(writer_env)] == [0, 1]


def test_killed_connection_and_db_down_is_retried_not_lost(
    clean_db: str, make_event: EventFactory
) -> None:
    forwarder = TcpRelay(_server_address(clean_db))
    forwarder.start()
    url = psycopg.conninfo.make_conninfo(clean_db, host="127.0.0.1", port=str(forwarder.port))
    writer = CheckpointWriter(WriterSettings(database_url=url))
    try:
        assert writer.process(parse_event(make_event([body(rank=0)]))).failed == []
        # The database disappears (connections dropped, port closed).
        conn, _ = writer.connection.get()
        forwarder.stop()
        with psycopg.connect(clean_db, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        event = make_event([body(rank=1), body(rank=2)])
        result = writer.process(parse_event(event))
        assert result.failed == [r["messageId"] for r in event["Records"]]
        assert result.transient_failures == 2
        forwarder.start()
        assert writer.process(parse_event(event)).failed == []
        assert [s[2] for s in shard_rows(clean_db)] == [0, 1, 2]
    finally:
        writer.connection.discard()
        forwarder.stop()


@pytest.fixture
def impatient_role(clean_db: str) -> Iterator[str]:
    """A test-only copy of ckpt_writer with a 300 ms statement_timeout; dropped afterwards."""
    role = f"ckpt_writer_t_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    with psycopg.connect(clean_db, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
        admin.execute(sql.SQL("ALTER ROLE {} SET statement_timeout = '300ms'").format(ident))
        admin.execute(sql.SQL("ALTER ROLE {} SET lock_timeout = 0").format(ident))
        admin.execute(sql.SQL("GRANT ckpt_writer TO {}").format(ident))
    try:
        yield psycopg.conninfo.make_conninfo(clean_db, user=role)
    finally:
        with psycopg.connect(clean_db, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            admin.execute(sql.SQL("DROP ROLE {}").format(ident))


def test_statement_timeout_rolls_back_the_whole_batch(
    clean_db: str, impatient_role: str, make_event: EventFactory
) -> None:
    writer = CheckpointWriter(WriterSettings(database_url=impatient_role))
    try:
        # GIVEN checkpoint step 200 exists and another session holds its row lock
        assert writer.process(parse_event(make_event([body(step=200)]))).failed == []
        before = all_rows(clean_db)
        with psycopg.connect(clean_db) as blocker:
            blocker.execute("SELECT 1 FROM training_checkpoints WHERE step = 200 FOR UPDATE")
            # WHEN a batch touches step 100 (new, locked first) and step 200 (blocked)
            event = make_event([body(step=100), body(step=200, rank=1)])
            result = writer.process(parse_event(event))
            # THEN statement_timeout cancels it: both records retried, step 100 not half-written
            assert result.failed == [r["messageId"] for r in event["Records"]]
            assert result.transient_failures == 2
            assert all_rows(clean_db) == before
        # WHEN the lock is released, the retry succeeds on the same (healthy) connection
        _, reused = writer.connection.get()
        assert reused
        assert writer.process(parse_event(event)).failed == []
        assert [(c[1], c[5]) for c in checkpoint_rows(clean_db)] == [(100, 1), (200, 2)]
    finally:
        writer.connection.discard()
