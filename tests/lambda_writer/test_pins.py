"""Migration 0008: the shard row keeps the report's pinned objects; older writers still work."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg

from lambda_writer import migrations
from lambda_writer.shared.connection import connect_url
from lambda_writer.writer import sql
from lambda_writer.writer.planning import plan_batch
from lambda_writer.writer.records import ValidReport
from tests.lambda_writer.helpers import EventFactory, Outgoing, body, invoke, report, sqs_messages

MIGRATIONS = Path(migrations.__file__).parent
PIN: dict[str, Any] = {
    "uri": "s3://bucket/job-a/step-100/rank-0.pt",
    "bytes": 16,
    "sha256": "ab" * 32,
    "checksum_algorithm": "SHA256",
    "checksum": "mDvDgA1H4om2F6izTLEtunVue6SmLijGphVeBa4vl3A=",
    "etag": '"304a00a399574e2064a3bb52d8581c85"',
    "version_id": "v-1",
}


def _objects(url: str) -> list[tuple[int, Any]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT rank, objects FROM training_checkpoint_shards ORDER BY rank"
        ).fetchall()


def test_the_handler_stores_the_pins_in_the_shard_row(
    writer_env: str, make_event: EventFactory
) -> None:
    # GIVEN one report with pins and one without WHEN written THEN the row holds the pins as
    # sent (absent ones left out) and NULL for the other; extra stays empty.
    pinned = body(rank=0, bytes=16, objects=[PIN])
    bare = body(rank=1, uri="s3://bucket/job-a/step-100/rank-1.pt")
    assert invoke(make_event([Outgoing(pinned, "job-a:0"), Outgoing(bare, "job-a:1")])) == []
    assert _objects(writer_env) == [(0, [PIN]), (1, None)]
    with psycopg.connect(writer_env) as conn:
        assert conn.execute("SELECT extra FROM training_checkpoint_shards").fetchall() == [
            ({},),
            ({},),
        ]


def test_a_newer_attempt_replaces_the_pins_and_a_replay_does_not(clean_db: str) -> None:
    first = {**PIN, "version_id": "v-1"}
    second = {**PIN, "version_id": "v-2"}

    def write(**fields: Any) -> None:
        r = report(bytes=16, **fields)
        plan = plan_batch([ValidReport(sqs_messages([body()])[0], r)])
        with connect_url(clean_db, autocommit=True) as conn:
            conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(plan))

    write(objects=[first])
    write(objects=[second])  # same attempt: a replay, no change
    assert _objects(clean_db) == [(0, [first])]
    write(objects=[second], run_attempt=1)
    assert _objects(clean_db) == [(0, [second])]


def test_the_previous_releases_shard_json_is_still_written(clean_db: str) -> None:
    # GIVEN the shard json of the writer before 0008 (no "objects" key) WHEN it calls the same
    # procedure THEN its rows are written, with objects NULL.
    plan = plan_batch([ValidReport(m, report()) for m in sqs_messages([body()])])
    checkpoints, shards = sql.write_params(plan)
    legacy = [{k: v for k, v in row.items() if k != "objects"} for row in json.loads(shards)]
    with connect_url(clean_db, autocommit=True) as conn:
        params = (sql.owners_param(plan), sql.launches_param(plan), checkpoints, json.dumps(legacy))
        conn.execute(sql.WRITE_BATCH, params)
    assert _objects(clean_db) == [(0, None)]


def test_0008_is_0006s_count_statement_with_one_more_column() -> None:
    # The correctness argument of 0006 (docs/DESIGN.md) carries over: only the column list, the
    # recordset's columns and the conflict update gain "objects".
    def body_of(name: str, marker: str) -> str:
        text = (MIGRATIONS / name).read_text()
        fn = text.split(marker)[1].split("$fn$")[1]
        return " ".join(re.sub(r"--[^\n]*", "", fn).split())

    old = body_of("0006_write_batch_slot_counts.sql", "CREATE FUNCTION ckpt_count_batch(")
    new = body_of("0008_shard_objects.sql", "CREATE OR REPLACE FUNCTION ckpt_count_batch(")
    patched = (
        old.replace("sqs_message_id, reported_at)", "sqs_message_id, reported_at, objects)")
        .replace("reported_at timestamptz)", "reported_at timestamptz, objects jsonb)", 1)
        .replace(
            "reported_at = EXCLUDED.reported_at,",
            "reported_at = EXCLUDED.reported_at, objects = EXCLUDED.objects,",
        )
    )
    assert new == patched
