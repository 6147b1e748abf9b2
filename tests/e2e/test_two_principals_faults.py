"""Two principals on one LocalStack queue under the fault scenarios (issue 44): a writer SIGKILLed
mid-batch, every record redriven to the DLQ by SQS, the DLQ replayed by the replay role, and a
forged report of one team for the other's job throughout. 0 rows applied across owners, 0 lost.

LocalStack stamps each access key's account id as SenderId (tests/e2e/test_two_principals.py),
so the two teams are two principals as two IAM roles are on AWS.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_contract import dlq as envelope
from ckpt_pipeline.local.sqs_server import PipelineQueues, create_pipeline_queues
from ckpt_pipeline.ops.replay import replay_dlq
from ckpt_pipeline.ops.sqs import queue_depth
from lambda_writer import WriterSettings
from tests.e2e.principals_writer import (
    OPERATOR,
    TEAM_A,
    TEAM_B,
    VISIBILITY_TIMEOUT_S,
    drain,
    sqs_client,
)
from tests.reports import body
from tests.trainer_client.helpers import wait_for

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = (10, 20, 30)
# The writer's statement waiting behind an owner change's lock (migration 0015): mid-batch.
BLOCKED = (
    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    " AND query LIKE 'CALL ckpt_write_batch_claimed%%'"
)


def _send(sqs: Any, queues: PipelineQueues, job: str, step: int, rank: int, **fields: Any) -> None:
    team = "forged" if "uri" in fields else job
    sqs.send_message(
        QueueUrl=queues.queue_url,
        MessageBody=body(job_id=job, step=step, rank=rank, world_size=2, **fields)
        if "uri" in fields
        else body(job_id=job, step=step, rank=rank, world_size=2, uri=f"s3://{team}/{step}/{rank}"),
        MessageGroupId=f"{job}:{rank}:{team}",
        MessageDeduplicationId=uuid.uuid4().hex,
    )


def _drain(endpoint: str, queues: PipelineQueues, url: str, *, empty_for_s: float) -> None:
    settings = WriterSettings(
        database_url=url, dlq_url=queues.dlq_url, replay_principal_id=OPERATOR
    )
    drain(
        endpoint, queues.queue_url, queues.queue_arn, settings,
        until_empty_for_s=empty_for_s, timeout=120,
    )  # fmt: skip


def _rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT job_id, step, rank, run_attempt, uri FROM training_checkpoint_shards"
            " ORDER BY 1, 2, 3"
        ).fetchall()


def test_sigkill_redrive_and_replay_keep_two_principals_jobs_apart(
    localstack_endpoint: str, clean_db: str
) -> None:
    team_a, team_b = (
        sqs_client(localstack_endpoint, TEAM_A),
        sqs_client(localstack_endpoint, TEAM_B),
    )
    operator = sqs_client(localstack_endpoint, OPERATOR)
    queues = create_pipeline_queues(
        team_a, prefix=f"f{uuid.uuid4().hex[:10]}", visibility_timeout_s=VISIBILITY_TIMEOUT_S,
        max_receive_count=2,
    )  # fmt: skip
    # GIVEN job-a started by team A and job-b by team B (their first steps written)
    for rank in (0, 1):
        _send(team_a, queues, "job-a", STEPS[0], rank)
        _send(team_b, queues, "job-b", STEPS[0], rank)
    _drain(localstack_endpoint, queues, clean_db, empty_for_s=0.5)
    # AND their next steps on the queue, with team B's forged reports for job-a among them: one
    # superseding job-a's newest step (run_attempt + 1), one a step job-a never saved
    for step in STEPS[1:]:
        for rank in (0, 1):
            _send(team_a, queues, "job-a", step, rank)
            _send(team_b, queues, "job-b", step, rank)
    _send(team_b, queues, "job-a", STEPS[-1], 0, run_attempt=1, uri="s3://forged/30/0")
    _send(team_b, queues, "job-a", 40, 0, uri="s3://forged/40/0")

    # WHEN a writer is SIGKILLed mid-batch (its statement waiting behind an owner change's lock)
    holder = psycopg.connect(clean_db)
    holder.execute("LOCK TABLE ckpt_job_owners IN SHARE ROW EXCLUSIVE MODE")
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.principals_writer", localstack_endpoint,
         queues.queue_url, queues.queue_arn, queues.dlq_url, clean_db],
        cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        with psycopg.connect(clean_db, autocommit=True) as probe:
            wait_for(lambda: (probe.execute(BLOCKED).fetchone() or (0,))[0] > 0, timeout=60)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        # AND every delivery after it fails (the lock held, the writer's lock_timeout short) until
        # SQS's redrive has moved every record to the DLQ
        failing = f"{clean_db} options='-c lock_timeout=300'"
        _drain(localstack_endpoint, queues, failing, empty_for_s=VISIBILITY_TIMEOUT_S + 2)
        wait_for(lambda: queue_depth(team_a, queues.dlq_url).visible == 10, timeout=60)
    finally:
        child.kill()
        holder.rollback()  # the killed writer's statement may now commit: nobody deletes its batch
        holder.close()
    # AND the replay role replays the DLQ, the writer drains it, and the DLQ is replayed again
    first = replay_dlq(operator, dlq_url=queues.dlq_url, queue_url=queues.queue_url)
    _drain(localstack_endpoint, queues, clean_db, empty_for_s=VISIBILITY_TIMEOUT_S + 1)
    second = replay_dlq(operator, dlq_url=queues.dlq_url, queue_url=queues.queue_url)
    _drain(localstack_endpoint, queues, clean_db, empty_for_s=1)

    # THEN every report of each team is in its own job, once, and nothing of the forged ones
    expected = [
        (job, step, rank, 0, f"s3://{job}/{step}/{rank}")
        for job in ("job-a", "job-b")
        for step in STEPS
        for rank in (0, 1)
    ]
    assert _rows(clean_db) == expected
    with psycopg.connect(clean_db) as conn:
        owners = conn.execute("SELECT job_id, owner FROM ckpt_job_owners ORDER BY 1").fetchall()
        latest = conn.execute(
            "SELECT job_id, step, run_attempt FROM latest_complete_checkpoints ORDER BY 1"
        ).fetchall()
    assert owners == [("job-a", TEAM_A), ("job-b", TEAM_B)]
    assert latest == [("job-a", 30, 0), ("job-b", 30, 0)]
    # AND the forged reports alone are left in the DLQ, as team B's, refused as foreign sender
    assert first.moved == 10 and second.moved == 0
    parked = team_a.receive_message(
        QueueUrl=queues.dlq_url, MessageAttributeNames=["All"], MaxNumberOfMessages=10,
        WaitTimeSeconds=1,
    ).get("Messages", [])  # fmt: skip
    assert len(parked) == 2
    for message in parked:
        attributes = message["MessageAttributes"]
        assert attributes[envelope.ERROR_CLASS]["StringValue"] == "ForeignSender"
        assert attributes[envelope.ORIGINAL_SENDER_ID]["StringValue"] == TEAM_B
        assert "forged" in message["Body"]
