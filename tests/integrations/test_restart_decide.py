"""Rank 0's wait and decision at a restart, against the real database and the real writer: a
report written while it waits is seen; one that never arrives ends the wait at the deadline with
one warning line, and the answer comes from what the database holds; a checkpoint whose last
shard row is committed but whose settle has not run yet is waited for, not skipped."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import psycopg
import pytest

from bench._reports import invoke, lambda_event, writer_environment
from lambda_writer import WriterHandler
from lambda_writer.writer.planning import plan_batch
from lambda_writer.writer.records import ValidReport, classify
from lambda_writer.writer.sql import write_params
from tests import reports
from tests.lambda_writer.helpers import sqs_messages
from trainer_client.restart.decide import connect_for_restart, decide_restart
from trainer_client.restart.say import tell_decision


def _written(handler: WriterHandler, job: str, step: int) -> None:
    report = reports.report(
        job_id=job, step=step, rank=0, world_size=1, uri=f"file:///ckpt/{job}/step-{step}"
    )
    invoke(handler, lambda_event([report]))


def test_the_wait_sees_what_is_written_meanwhile_and_ends_at_the_deadline(
    clean_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainer_client")
    job = f"decide-{uuid.uuid4().hex[:8]}"
    handler = writer_environment(clean_db)
    _written(handler, job, 5)
    # WHEN step 10's report is in flight and the writer stores it half a second into the wait
    timer = threading.Timer(0.5, _written, (handler, job, 10))
    timer.start()
    with connect_for_restart(clean_db) as conn:
        decision = decide_restart(
            conn, job, [(10, 0, 0)], time.monotonic() + 30, check_files=False, s3_client=None,
            max_workers=4,
        )  # fmt: skip
    timer.join()
    # THEN the decision is step 10, not step 5, and no warning
    assert decision.point is not None and decision.point.step == 10
    assert not caplog.records
    # WHEN a report in flight never arrives (parked in the DLQ, say)
    started = time.monotonic()
    with connect_for_restart(clean_db) as conn:
        decision = decide_restart(
            conn, job, [(20, 0, 0)], started + 0.5, check_files=False, s3_client=None,
            max_workers=4,
        )  # fmt: skip
    # THEN the wait ends at the deadline and answers from what the database holds, saying so
    assert time.monotonic() - started < 5
    assert decision.point is not None and decision.point.step == 10
    assert decision.unwritten == ((20, 0, 0),)
    # AND the restart's own lines say so (rank 0 tells them; with logging unconfigured on stderr)
    caplog.clear()
    tell_decision(job, decision, [], 0.1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    (warning,) = warnings
    assert "1 report(s) SQS accepted" in warning and "step 20 rank 0 attempt 0" in warning


def test_a_checkpoint_counted_whole_but_not_yet_settled_is_waited_for(clean_db: str) -> None:
    # GIVEN step 5 complete, and step 10's only report written by the writer's first phase: its
    # shard row and count committed, the settle that marks it complete not yet run (the instant
    # between the two transactions of ckpt_write_batch_counted, migrations 0006/0007)
    job = f"settle-{uuid.uuid4().hex[:8]}"
    handler = writer_environment(clean_db)
    _written(handler, job, 5)
    body = reports.body(
        job_id=job, step=10, rank=0, world_size=1, uri=f"file:///ckpt/{job}/step-10"
    )
    (valid,) = [classify(m) for m in sqs_messages([body])]
    assert isinstance(valid, ValidReport)
    checkpoints, shards = write_params(plan_batch([valid]))
    with psycopg.connect(clean_db, autocommit=True) as writer:
        writer.execute("SELECT * FROM ckpt_count_batch(%s::json, %s::json)", (checkpoints, shards))
        # WHEN the restart decides while the settle runs half a second later
        settle = threading.Timer(
            0.5,
            lambda: writer.execute("SELECT ckpt_settle_checkpoints(%s::json)", (checkpoints,)),
        )
        settle.start()
        with connect_for_restart(clean_db) as conn:
            decision = decide_restart(
                conn, job, [(10, 0, 0)], time.monotonic() + 30, check_files=False,
                s3_client=None, max_workers=4,
            )  # fmt: skip
        settle.join()
    # THEN it resumes from step 10, which the settle completes, not from step 5
    assert decision.point is not None and decision.point.step == 10
