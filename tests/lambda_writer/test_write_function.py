"""The writer's batch function: its shape (0004: one statement, no recount; 0005: the same
statement with json parameters) and the exactness of 0005's parameters against the database."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lambda_writer import migrations
from lambda_writer.shared.connection import Connection, connect_url
from lambda_writer.writer.exceptions import PermanentWriteError
from lambda_writer.writer.planning import BatchPlan, CheckpointUpsert, ShardRow
from lambda_writer.writer.repository import write_batch

FUNCTION = (Path(migrations.__file__).parent / "0004_write_batch_delta_count.sql").read_text()
BODY = FUNCTION.split("$fn$")[1]


def test_the_batch_is_one_statement_without_session_state() -> None:
    # Comments aside, the body is BEGIN, one WITH … SELECT … INTO, END.
    code = re.sub(r"--[^\n]*", "", BODY)
    assert code.count(";") == 1  # END has none: the one statement
    assert code.count("INSERT INTO training_checkpoints") == 1
    assert code.count("INSERT INTO training_checkpoint_shards") == 1
    assert "RETURNING s.job_id, s.step, s.run_attempt" in code
    forbidden = (
        r"\b(PREPARE|DEALLOCATE|DISCARD|SAVEPOINT|pg_advisory\w*|TEMP|TEMPORARY|LISTEN|nextval"
        r"|set_config|EXECUTE)\b"
    )
    assert not re.search(forbidden, code, re.IGNORECASE)
    assert not re.search(r"^\s*SET\b", code, re.IGNORECASE | re.MULTILINE)


def test_no_statement_reads_the_checkpoints_shards() -> None:
    # The count moves by the batch's delta: nothing scans the stored shards (0003's recount did,
    # O(world_size) per batch).
    code = re.sub(r"--[^\n]*", "", BODY)
    assert not re.search(r"\b(FROM|JOIN)\s+training_checkpoint_shards\b", code, re.IGNORECASE)
    assert "CREATE OR REPLACE FUNCTION ckpt_write_batch(" in FUNCTION  # same signature as 0003


# Migration 0005: the same statement, fed two json texts (lambda_writer.writer.sql) instead of 20
# arrays.
FUNCTION_0005 = (Path(migrations.__file__).parent / "0005_write_batch_json.sql").read_text()
BODY_0005 = FUNCTION_0005.split("$fn$")[1]


def test_0005_is_0004s_statement_with_json_parameters() -> None:
    code = re.sub(r"--[^\n]*", "", BODY_0005)
    assert code.count(";") == 1
    assert "RETURNING s.job_id, s.step, s.run_attempt" in code
    assert not re.search(r"\b(FROM|JOIN)\s+training_checkpoint_shards\b", code, re.IGNORECASE)
    # Everything but the row sources is 0004's text: the correctness argument carries over.
    old = re.sub(r"--[^\n]*", "", BODY)
    for start, end in (
        ("ON CONFLICT (job_id, step, rank)", "), contribution AS ("),
        ("), checkpoint AS (", "END"),
    ):
        assert _between(code, start, end) == _between(old, start, end)
    assert "CREATE FUNCTION ckpt_write_batch_json(" in FUNCTION_0005  # 0004's function stays
    assert "GRANT EXECUTE ON FUNCTION ckpt_write_batch_json(json, json) TO ckpt_writer" in (
        FUNCTION_0005
    )


# Migration 0006: the count goes to the backend's own count row; the checkpoint row is written
# only when raised or settled.
MIGRATION_0006 = (Path(migrations.__file__).parent / "0006_write_batch_slot_counts.sql").read_text()
COUNT_0006 = MIGRATION_0006.split("CREATE FUNCTION ckpt_count_batch(")[1].split("$fn$")[1]


def test_0006_counts_with_0005s_shard_upsert_and_no_per_batch_checkpoint_write() -> None:
    code = re.sub(r"--[^\n]*", "", COUNT_0006)
    assert code.count(";") == 1  # still one statement
    old = re.sub(r"--[^\n]*", "", BODY_0005)
    # The shard upsert and the delta are 0005's text: facts (b)-(d) of DESIGN.md carry over.
    shard_upsert = ("INSERT INTO training_checkpoint_shards", "), contribution AS (")
    assert _between(code, *shard_upsert) == _between(old, *shard_upsert)
    delta = _between(code, "), contribution AS (", "), raised AS (")
    assert delta == _between(old, "), contribution AS (", "), checkpoint AS (")
    # The checkpoint upsert runs only for rows the snapshot does not show as already holding the
    # batch's values, and it no longer carries the count; the count goes to this backend's row.
    raised = _between(code, "), raised AS (", "), counted AS (")
    assert "WHERE NOT EXISTS" in raised and "EXCLUDED.shards_present" not in raised
    counted = _between(code, "), counted AS (", "SELECT (SELECT count(*) FROM moved)")
    assert "pg_backend_pid()" in counted and "(SELECT count(*) FROM raised) >= 0" in counted
    assert not re.search(r"\b(FROM|JOIN)\s+training_checkpoint_shards\b", code, re.IGNORECASE)
    # Nothing that a proxy would pin on reaches the client: one CALL, no SET, no session locks.
    assert not re.search(r"\bpg_advisory_lock\b|^\s*SET\b", MIGRATION_0006, re.MULTILINE)
    assert "CREATE OR REPLACE FUNCTION ckpt_write_batch_json(" in MIGRATION_0006


def _between(text: str, start: str, end: str) -> str:
    part = text[text.index(start) :]
    return " ".join(part[: part.index(end)].split())


def _plan(job: str, uri: str, **shard: Any) -> BatchPlan:
    at = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    fields: dict[str, Any] = {
        "job_id": job, "step": 2**62, "rank": 1, "run_attempt": 3, "epoch": 2**40,
        "world_size": 2, "uri": uri, "loss": 5e-324, "metrics_json": json.dumps({"a": 1.0}),
        "size_bytes": 2**63 - 1, "sha256": None, "extra_json": "{}", "sqs_message_id": "m-1",
        "reported_at": at,
    }  # fmt: skip
    fields.update(shard)
    row = ShardRow(**fields)
    cp = CheckpointUpsert(job, row.step, row.run_attempt, row.epoch, row.world_size, at)
    return BatchPlan((cp,), (row,), 1)


TRICKY = 'q"uote\\back/slash\n\t\r\x01\x1f é ß 漢字 😀 \u2028\u2029 </script> %s %(x)s $1'


def test_json_parameters_round_trip_every_value_exactly(clean_db: str) -> None:
    metrics = {TRICKY: -12.5, "b": 0.1, "c": 1e-7}  # (jsonb keeps numbers as numeric)
    extra = {"nested": {TRICKY: [1, None, True, "x"]}}
    plan = _plan(
        TRICKY,
        TRICKY + "/rank-1.pt",
        loss=-0.0,
        metrics_json=json.dumps(metrics, sort_keys=True),
        extra_json=json.dumps(extra, sort_keys=True),
        sha256="ab" * 32,
    )
    with connect_url(clean_db, autocommit=True) as conn:
        outcome = write_batch(conn, plan)
        shard = conn.execute(
            "SELECT job_id, step, rank, run_attempt, epoch, world_size, uri, loss, metrics,"
            " size_bytes, sha256, extra, sqs_message_id, reported_at"
            " FROM training_checkpoint_shards"
        ).fetchall()
        cp = conn.execute(
            "SELECT job_id, step, run_attempt, epoch, world_size, first_reported_at,"
            " shards_present FROM training_checkpoint_progress"
        ).fetchall()
    assert (outcome.shard_rows_changed, outcome.checkpoint_rows_changed) == (1, 1)
    s = plan.shards[0]
    assert shard == [
        (s.job_id, s.step, s.rank, s.run_attempt, s.epoch, s.world_size, s.uri, s.loss, metrics,
         s.size_bytes, s.sha256, extra, s.sqs_message_id, s.reported_at)
    ]  # fmt: skip
    c = plan.checkpoints[0]
    assert cp == [(c.job_id, c.step, c.run_attempt, c.epoch, c.world_size, c.first_reported_at, 1)]


def test_nulls_round_trip_and_a_nul_character_is_a_permanent_error(clean_db: str) -> None:
    with connect_url(clean_db, autocommit=True) as conn:
        write_batch(conn, _plan("job-n", "u", loss=None, size_bytes=None, sha256=None))
        row = conn.execute(
            "SELECT loss, size_bytes, sha256 FROM training_checkpoint_shards"
        ).fetchone()
        assert row == (None, None, None)
        # PostgreSQL text cannot hold U+0000: refused as data (as psycopg refused it client-side
        # with 0004's arrays), so the record is isolated and dead-lettered, not retried forever.
        with pytest.raises(PermanentWriteError):
            write_batch(conn, _plan("job-z", "bad\x00uri"))


def test_the_settle_runs_once_per_attempt_not_per_batch(clean_db: str) -> None:
    # Migration 0007: after its commit a batch reads whether an attempt of it is ready to
    # settle, and calls ckpt_settle_checkpoints only then (0006 called it after every batch).
    def plan(ranks: range) -> BatchPlan:
        at = datetime(2026, 3, 4, tzinfo=UTC)
        rows = tuple(
            ShardRow(
                job_id="job-s",
                step=7,
                rank=r,
                run_attempt=0,
                epoch=1,
                world_size=6,
                uri=f"s3://b/job-s/7/{r}.pt",
                loss=None,
                metrics_json="{}",
                size_bytes=None,
                sha256=None,
                extra_json="{}",
                sqs_message_id=f"m-{r}",
                reported_at=at,
            )
            for r in ranks
        )
        return BatchPlan((CheckpointUpsert("job-s", 7, 0, 1, 6, at),), rows, len(rows))

    def settles(conn: Connection) -> int:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
            " WHERE funcname = 'ckpt_settle_checkpoints'"
        ).fetchone()
        return 0 if row is None else int(row[0])

    with connect_url(clean_db, autocommit=True) as conn:
        conn.execute("SET track_functions = 'pl'")  # a test session (superuser), not the writer's
        before = settles(conn)
        outcomes = [write_batch(conn, plan(range(r, r + 2))) for r in (0, 2, 4)]
        assert settles(conn) - before == 1  # the batch that completed the attempt
        write_batch(conn, plan(range(4, 6)))  # a replay once complete: nothing to settle
        assert settles(conn) - before == 1
        row = conn.execute(
            "SELECT shards_present, is_complete FROM training_checkpoints WHERE job_id = 'job-s'"
        ).fetchone()
    assert [o.checkpoint_rows_changed for o in outcomes] == [1, 0, 1]  # insert, -, settle
    assert row == (6, True)  # the counts moved into the row
