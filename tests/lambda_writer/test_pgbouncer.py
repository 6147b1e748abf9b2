"""Through PgBouncer in transaction pooling mode (RDS Proxy's stand-in): the writer works unchanged,
and it leaves no session state that a multiplexing proxy would have to pin."""

from __future__ import annotations

import dataclasses
import threading

import psycopg

from lambda_writer.shared.settings import WriterSettings
from lambda_writer.writer.batch import BatchResult, CheckpointWriter
from tests.lambda_writer.helpers import (
    EventFactory,
    Outgoing,
    body,
    checkpoint_rows,
    environment,
    invoke,
    sqs_messages,
)


def test_handler_through_pgbouncer(
    writer_settings: WriterSettings, pgbouncer_port: int, make_event: EventFactory
) -> None:
    url = writer_settings.database_url
    assert url is not None
    pooled = psycopg.conninfo.make_conninfo(url, port=str(pgbouncer_port))
    with environment(dataclasses.replace(writer_settings, database_url=pooled)):
        for step in range(6):
            event = make_event(
                [Outgoing(body(step=step, rank=r), group_id=f"job-a:{r}") for r in range(4)]
                + [Outgoing("garbage", group_id="job-a:9")]
            )
            assert invoke(event) == []
            assert invoke(event) == []  # replay through the pooler
    rows = checkpoint_rows(url)
    assert [(r[1], r[5], r[6]) for r in rows] == [(s, 4, True) for s in range(6)]


def test_two_writers_share_one_server_connection(clean_db: str, pgbouncer_port: int) -> None:
    # default_pool_size = 1: both clients' transactions run on the same server connection, so
    # any session state one of them left behind (SET, PREPARE) would break or leak into the other.
    url = psycopg.conninfo.make_conninfo(clean_db, port=str(pgbouncer_port))
    writers = [CheckpointWriter(WriterSettings(database_url=url)) for _ in range(2)]
    results: list[BatchResult] = []

    def run(index: int) -> None:
        for step in range(index, 60, 2):
            messages = sqs_messages([body(step=step, rank=r) for r in range(4)])
            results.append(writers[index].process(messages))
            results.append(writers[index].process(messages))

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(results) == 120
        assert all(r.failed == [] for r in results)
        assert sum(r.rows_changed for r in results) == 240
        assert sum(r.noop_replays for r in results) == 240
        assert [(r[1], r[6]) for r in checkpoint_rows(clean_db)] == [(s, True) for s in range(60)]
    finally:
        for w in writers:
            w.connection.discard()


def test_writer_leaves_no_session_state(clean_db: str) -> None:
    # Directly on the writer's own server connection after many batches (incl. rollbacks):
    # nothing that RDS Proxy pins on.
    writer = CheckpointWriter(WriterSettings(database_url=clean_db))
    # A CHECK the contract cannot know of makes every second batch fail and roll back (the
    # contract itself refuses values the columns cannot hold).
    with psycopg.connect(clean_db, autocommit=True) as admin:
        admin.execute(
            "ALTER TABLE training_checkpoint_shards ADD CONSTRAINT test_no_poison_uri"
            " CHECK (uri <> 'file:///poison') NOT VALID"
        )
    try:
        for step in range(8):
            writer.process(sqs_messages([body(step=step, rank=r) for r in range(4)]))
            writer.process(sqs_messages([body(step=step, rank=0, uri="file:///poison")]))
        conn, _ = writer.connection.get()
        assert conn.prepare_threshold is None
        with conn.transaction():
            prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
            session_settings = conn.execute(
                "SELECT name FROM pg_settings WHERE source = 'session'"
            ).fetchall()
            advisory = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid()"
            ).fetchone()
            cursors = conn.execute("SELECT count(*) FROM pg_cursors").fetchone()
            temp = conn.execute(
                "SELECT count(*) FROM pg_class WHERE relpersistence = 't'"
            ).fetchone()
        assert prepared == (0,)
        assert session_settings == []
        assert advisory == (0,)
        assert cursors == (0,)
        assert temp == (0,)
    finally:
        writer.connection.discard()
        with psycopg.connect(clean_db, autocommit=True) as admin:
            admin.execute(
                "ALTER TABLE training_checkpoint_shards DROP CONSTRAINT test_no_poison_uri"
            )
