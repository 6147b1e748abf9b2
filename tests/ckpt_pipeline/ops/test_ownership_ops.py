"""Issue 44's operator side: a `foreign sender` report refused by replay-dlq, never made
applicable by a replay, discarded with its reason recorded (issue 40); jobs, transfer, release.

The writer parks the stranger's report itself (the real CheckpointWriter, moto's DLQ); its
records carry two SenderIds as Lambda's records from two roles do (moto stamps one id on every
message: docs/DESIGN.md, "Who may write a job").
"""

from __future__ import annotations

import json
import os
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.event_source import LocalEventSource
from ckpt_pipeline.local.sqs_server import PipelineQueues
from ckpt_pipeline.ops.sqs import queue_depth
from lambda_writer import WriterSettings, make_handler
from lambda_writer.writer.batch import CheckpointWriter
from tests.lambda_writer.helpers import MOTO_SENDER_ID, body, sqs_messages

OWNER_ROLE = "AROAOWNERROLEEXAMPLE"
STRANGER_ROLE = "AROASTRANGERROLEEXAM"
STRANGER = f"{STRANGER_ROLE}:i-0ccc"
FOREIGN = body(step=100, rank=0, world_size=1, run_attempt=1)


def _shards(url: str) -> list[tuple[int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT step, run_attempt FROM training_checkpoint_shards WHERE job_id = 'job-a'"
        ).fetchall()
    return [(int(s), int(a)) for s, a in rows]


@pytest.fixture
def parked(clean_db: str, fast_queues: PipelineQueues) -> str:
    """Job A's step 100 written by its owner, and a stranger's attempt 1 of it in the DLQ."""
    writer = CheckpointWriter(WriterSettings(database_url=clean_db, dlq_url=fast_queues.dlq_url))
    try:
        owned = writer.process(sqs_messages([body(world_size=1)], sender_id=f"{OWNER_ROLE}:i-0a"))
        assert (owned.written, owned.poison) == (1, 0)
        foreign = writer.process(sqs_messages([FOREIGN], sender_id=STRANGER))
        assert (foreign.written, foreign.poison, foreign.failed) == (0, 1, [])
    finally:
        writer.connection.discard()
    return clean_db


def test_replay_refuses_a_foreign_sender_in_one_line_and_discard_records_it(
    parked: str,
    sqs: Any,
    fast_queues: PipelineQueues,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dlq = ["--dlq-url", fast_queues.dlq_url, "--queue-url", fast_queues.queue_url]
    # WHEN the operator replays the DLQ THEN the foreign report is refused in one line, and stays
    assert main(["-q", "replay-dlq", *dlq]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ForeignSender: foreign sender: job 'job-a'" in err[0]
    assert OWNER_ROLE in err[0] and STRANGER in err[0] and "refused" in err[0]
    assert queue_depth(sqs, fast_queues.dlq_url).visible == 1
    assert _shards(parked) == [(100, 0)]

    # WHEN it is re-sent anyway (--after-transfer, no transfer made) and the writer, which takes
    # this very principal for the replay principal, reads it THEN it is refused again
    assert main(["-q", "replay-dlq", *dlq, "--after-transfer"]) == 0
    settings = WriterSettings(
        database_url=parked, dlq_url=fast_queues.dlq_url, replay_principal_id=MOTO_SENDER_ID
    )
    handler = make_handler(settings, emit_metrics=False)
    try:
        source = LocalEventSource(
            sqs,
            queue_url=fast_queues.queue_url,
            queue_arn=fast_queues.queue_arn,
            handler=handler,
            wait_time_s=1,
        )
        assert source.drain(until_empty_for_s=0.3, timeout=60).drained
    finally:
        handler.close()
    assert _shards(parked) == [(100, 0)]
    (back,) = sqs.receive_message(
        QueueUrl=fast_queues.dlq_url,
        MessageAttributeNames=["All"],
        VisibilityTimeout=0,
        WaitTimeSeconds=1,
    )["Messages"]
    assert back["MessageAttributes"]["ErrorClass"]["StringValue"] == "ForeignSender"
    assert back["MessageAttributes"]["OriginalSenderId"]["StringValue"] == STRANGER

    # WHEN the operator discards it with a reason THEN it is recorded, then gone from the DLQ
    env = {**os.environ, "DATABASE_URL": parked}
    assert main(["-q", "replay-dlq", *dlq, "--discard", "  a stranger's  test report "], env) == 0
    assert queue_depth(sqs, fast_queues.dlq_url).total == 0
    with psycopg.connect(parked) as conn:
        rows = conn.execute(
            "SELECT job_id, sender_id, error_class, body, reason, discarded_by"
            " FROM ckpt_dlq_discards"
        ).fetchall()
    assert rows == [
        ("job-a", STRANGER, "ForeignSender", FOREIGN, "a stranger's test report", "postgres")
    ]


def test_a_discard_not_recorded_deletes_nothing(
    parked: str, sqs: Any, fast_queues: PipelineQueues
) -> None:
    # GIVEN the audit table refuses rows (the operator's role lacks the grant, a full disk...)
    with psycopg.connect(parked, autocommit=True) as conn:
        conn.execute("ALTER TABLE ckpt_dlq_discards ADD CHECK (reason <> 'refused')")
    env = {**os.environ, "DATABASE_URL": parked}
    dlq = ["--dlq-url", fast_queues.dlq_url]
    # WHEN a discard runs THEN it fails, and the message is still in the DLQ
    assert main(["-q", "replay-dlq", *dlq, "--discard", "refused"], env) == 1
    assert queue_depth(sqs, fast_queues.dlq_url).total == 1
    # AND a discard without a reason is refused before anything is read
    assert main(["-q", "replay-dlq", *dlq, "--discard", " "], env) == 2


def test_jobs_lists_owners_and_transfer_release_are_audited(
    parked: str,
    fast_queues: PipelineQueues,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {**os.environ, "DATABASE_URL": parked}
    capsys.readouterr()
    assert main(["jobs", "--json"], env) == 0
    (job,) = json.loads(capsys.readouterr().out)
    assert (job["job_id"], job["owner"], job["checkpoints"]) == ("job-a", OWNER_ROLE, 1)
    assert job["first_sender"] == f"{OWNER_ROLE}:i-0a"
    # A SenderId with its session is not a principal: refused, nothing changed
    assert main(["jobs", "transfer", "job-a", "--to", STRANGER, "--reason", "moved"], env) == 2
    assert "--to" in capsys.readouterr().err
    # WHEN the job is transferred to the stranger's role THEN its reports are applied
    assert main(["jobs", "transfer", "job-a", "--to", STRANGER_ROLE, "--reason", "moved"], env) == 0
    assert f"{OWNER_ROLE} -> {STRANGER_ROLE}" in capsys.readouterr().out
    writer = CheckpointWriter(WriterSettings(database_url=parked, dlq_url=fast_queues.dlq_url))
    try:
        assert writer.process(sqs_messages([FOREIGN], sender_id=STRANGER)).written == 1
    finally:
        writer.connection.discard()
    assert _shards(parked) == [(100, 1)]
    # WHEN it is released THEN it has no owner, and both changes are audited
    assert main(["jobs", "release", "job-a", "--reason", "relaunch under a new role"], env) == 0
    assert main(["jobs", "release", "job-a", "--reason", "again"], env) == 1
    with psycopg.connect(parked) as conn:
        audit = conn.execute(
            "SELECT action, old_owner, new_owner, reason, changed_by"
            " FROM ckpt_job_owner_changes ORDER BY id"
        ).fetchall()
        owners = conn.execute("SELECT count(*) FROM ckpt_job_owners").fetchone()
    assert audit == [
        ("transfer", OWNER_ROLE, STRANGER_ROLE, "moved", "postgres"),
        ("release", STRANGER_ROLE, None, "relaunch under a new role", "postgres"),
    ]
    assert owners == (0,)


def test_backfilled_reports_carry_the_jobs_owner(
    parked: str, sqs: Any, fast_queues: PipelineQueues
) -> None:
    # GIVEN job A owned by its role WHEN reconcile backfills a checkpoint of it THEN the reports
    # name the owner as their original sender, as a replay does
    from ckpt_pipeline.ops.jobs import job_owner
    from ckpt_pipeline.ops.reconcile_backfill import send_reports
    from lambda_writer import connect_url
    from tests.reports import report

    with connect_url(parked, autocommit=True) as conn:
        owner = job_owner(conn, "job-a")
        assert job_owner(conn, "job-unknown") is None
    assert owner == OWNER_ROLE
    assert send_reports(sqs, fast_queues.queue_url, [report(step=200)], owner=owner) == 1
    (sent,) = sqs.receive_message(
        QueueUrl=fast_queues.queue_url, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert sent["MessageAttributes"]["OriginalSenderId"]["StringValue"] == OWNER_ROLE
