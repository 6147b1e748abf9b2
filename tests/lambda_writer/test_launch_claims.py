"""The writer's launch claim once per batch (migration 0018): the same rule and the same refusal
as 0014's row trigger, which still guards every other INSERT path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

import lambda_writer.migrations
from lambda_writer.writer import sql
from lambda_writer.writer.planning import BatchPlan, plan_batch
from lambda_writer.writer.records import ValidReport, classify
from tests.lambda_writer.helpers import body, sqs_messages

SENDER = "AROAOWNERROLEEXAMPLE:i-0aaa"
# The previous release's statement (0007's procedure): rows checked one by one by the trigger.
COUNTED = "CALL ckpt_write_batch_counted(%s::json, %s::json, NULL, NULL)"


def _plan(*reports: dict[str, Any]) -> BatchPlan:
    messages = sqs_messages([body(**fields) for fields in reports], sender_id=SENDER)
    valid = [classify(m) for m in messages]
    assert all(isinstance(v, ValidReport) for v in valid)
    return plan_batch([v for v in valid if isinstance(v, ValidReport)])


def _refusal(conn: psycopg.Connection[Any], statement: str, params: tuple[str, ...]) -> str:
    with pytest.raises(psycopg.errors.IntegrityError) as refused:
        conn.execute(statement, params)
    assert refused.value.sqlstate == "23C01"
    diag = refused.value.diag
    return f"{diag.message_primary} / {diag.message_hint}"


def test_the_plan_claims_once_per_step_attempt_and_launch() -> None:
    # GIVEN a batch of 4 ranks of step 7 and 2 of step 8 from launch L1, one rank without a launch
    ranks = [dict(step=7, rank=r, world_size=4, launch_id="L1") for r in (3, 0, 2, 1)]
    ranks += [dict(step=8, rank=r, world_size=4, launch_id="L1") for r in (1, 0)]
    ranks.append(dict(job_id="job-b", step=1, rank=0, world_size=1))
    # WHEN planned, THEN one claim per (job, step, attempt, launch), naming its first rank by key
    assert _plan(*ranks).launches == (("job-a", 7, 0, 0, "L1"), ("job-a", 8, 0, 0, "L1"))


def test_the_batch_refusal_is_the_row_triggers_word_for_word(clean_db: str) -> None:
    # GIVEN launch L1 claimed attempt 0 of job A through the writer's procedure
    mine = _plan(dict(step=5, rank=0, world_size=2, launch_id="L1"))
    theirs = _plan(
        dict(step=5, rank=1, world_size=2, launch_id="L2"),
        dict(step=6, rank=0, world_size=2, launch_id="L2"),
    )
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(mine))
        # WHEN launch L2's batch of that attempt comes through the procedure and through 0007's
        batch = _refusal(conn, sql.WRITE_BATCH, sql.claimed_write_params(theirs))
        row = _refusal(conn, COUNTED, sql.write_params(theirs))
        # THEN both refuse it with 23C01 and one message, and nothing of L2 is stored
        assert batch == row
        assert "belongs to launch L1" in batch and "(step 5, rank 1) is of launch L2" in batch
        stored = conn.execute("SELECT step, rank FROM training_checkpoint_shards").fetchall()
        claims = conn.execute("SELECT launch_id FROM training_job_launches").fetchall()
    assert stored == [(5, 0)] and claims == [("L1",)]


def test_the_mark_ends_with_the_call_and_other_paths_stay_guarded(clean_db: str) -> None:
    # GIVEN the writer's procedure wrote L1's report on this very session
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(_plan(dict(launch_id="L1"))))
        assert conn.execute("SELECT current_setting('ckpt.launch_checked', true)").fetchone() in (
            (None,),
            ("",),
        )
        # WHEN the same session inserts another launch's row by another path (0007's statement,
        # inside a caller's transaction, a plain INSERT), THEN the row trigger refuses each
        other = _plan(dict(rank=1, launch_id="L2"))
        _refusal(conn, COUNTED, sql.write_params(other))
        _refusal(conn, sql.WRITE_BATCH_IN_TRANSACTION, sql.owned_write_params(other))
        with pytest.raises(psycopg.errors.IntegrityError):
            conn.execute(
                "INSERT INTO training_checkpoint_shards (job_id, step, rank, run_attempt, epoch,"
                " world_size, uri, extra, sqs_message_id, reported_at)"
                " VALUES ('job-a', 100, 1, 0, 0, 2, 'file:///x', '{\"launch_id\": \"L2\"}',"
                " 'm', now())"
            )


def test_a_row_a_tombstone_fences_claims_nothing_as_before(clean_db: str) -> None:
    # GIVEN a prune's tombstone fencing attempts below 1 of step 100, and L1 owning attempt 0
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO training_checkpoint_tombstones (job_id, step, min_run_attempt)"
            " VALUES ('job-a', 100, 1)"
        )
        mine = _plan(dict(step=101, launch_id="L1"))
        conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(mine))
        # WHEN another launch's fenced report of step 100 arrives, THEN it is dropped, not refused
        late = _plan(dict(step=100, launch_id="L2"))
        changed = conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(late)).fetchone()
        claims = conn.execute("SELECT launch_id FROM training_job_launches").fetchall()
    assert changed == (0, 0) and claims == [("L1",)]


def test_0018s_procedure_is_0007s_body_after_the_claims() -> None:
    # As 0015's (tests/lambda_writer/test_ownership.py): what precedes 0007's body only reads,
    # claims and marks the transaction.
    migrations = Path(lambda_writer.migrations.__file__).parent

    def body_of(name: str, marker: str) -> str:
        fn = (migrations / name).read_text().split(marker)[1].split("$fn$")[1]
        return fn.split("BEGIN", 1)[1]

    counted = body_of(
        "0007_write_batch_lock_before_count.sql",
        "CREATE OR REPLACE PROCEDURE ckpt_write_batch_counted(",
    )
    claimed = body_of("0018_batch_launch_claims.sql", "CREATE PROCEDURE ckpt_write_batch_claimed(")
    claim, repeated = claimed.split("    -- 0007's ckpt_write_batch_counted from here.\n")
    assert repeated == counted.lstrip("\n")
    assert "ckpt_claim_jobs(owners)" in claim and "ckpt_claim_launches(launches)" in claim
    assert "COMMIT" not in claim
