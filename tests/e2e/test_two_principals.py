"""Two principals on one queue (issue 44), on the emulator that tells them apart.

LocalStack stamps SenderId with the caller's account id, which it takes from a 12-digit access
key id (localstack/services/sqs/provider.py, aws/accounts.py), whatever queue URL is called;
moto stamps one constant id on every message (docs/DESIGN.md, "Who may write a job"). So two
access keys here are two principals, and the writer sees their ids through the local event source
exactly as SQS gave them.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from ckpt_contract import dlq as envelope
from ckpt_pipeline.local.event_source import LocalEventSource
from ckpt_pipeline.local.sqs_server import PipelineQueues, create_pipeline_queues
from ckpt_pipeline.ops.replay import replay_dlq
from ckpt_pipeline.ops.replay_plan import ReplayFilter
from ckpt_pipeline.ops.sqs import queue_depth
from lambda_writer import WriterSettings
from lambda_writer.writer.batch import CheckpointWriter
from lambda_writer.writer.dlq import DeadLetterQueue
from lambda_writer.writer.records import parse_event
from tests.e2e.principals_writer import sqs_client
from tests.reports import body

TEAM_A = "111111111111"
TEAM_B = "222222222222"
# The writer's own role (it sends poison to the DLQ), and the operators' replay role.
WRITER = "333333333333"
OPERATOR = "444444444444"


def _send(sqs: Any, queue_url: str, text: str, group: str) -> None:
    sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=text,
        MessageGroupId=group,
        MessageDeduplicationId=uuid.uuid4().hex,
    )


def _drain(endpoint: str, queues: PipelineQueues, settings: WriterSettings) -> None:
    """The real writer, its DLQ client LocalStack's (explicitly: the tests' AWS_ENDPOINT_URL may
    be moto's), fed by the local event source under the writer's own access key."""
    sqs = sqs_client(endpoint, WRITER)
    writer = CheckpointWriter(settings, dlq=DeadLetterQueue(sqs, queues.dlq_url))

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return writer.process(parse_event(event)).batch_response()

    try:
        source = LocalEventSource(
            sqs,
            queue_url=queues.queue_url,
            queue_arn=queues.queue_arn,
            handler=handler,
            wait_time_s=1,
        )
        assert source.drain(until_empty_for_s=0.5, timeout=60).drained
    finally:
        writer.connection.discard()


@pytest.mark.slow
def test_two_principals_on_one_queue_stay_apart(localstack_endpoint: str, clean_db: str) -> None:
    team_a, team_b = (
        sqs_client(localstack_endpoint, TEAM_A),
        sqs_client(localstack_endpoint, TEAM_B),
    )
    queues = create_pipeline_queues(team_a, prefix=f"p{uuid.uuid4().hex[:10]}")
    settings = WriterSettings(database_url=clean_db, dlq_url=queues.dlq_url)
    # GIVEN team A's job with complete steps 10 and 20, and team B's own job, on one queue
    for step in (10, 20):
        for rank in (0, 1):
            _send(team_a, queues.queue_url, body(step=step, rank=rank, world_size=2), f"a:{rank}")
    _send(team_b, queues.queue_url, body(job_id="job-b", step=5, world_size=1), "b:0")
    _drain(localstack_endpoint, queues, settings)
    # WHEN team B sends one report for job A's newest step with run_attempt + 1
    foreign = body(step=20, rank=0, world_size=2, run_attempt=1)
    _send(team_b, queues.queue_url, foreign, "b:1")
    _drain(localstack_endpoint, queues, settings)
    # THEN nothing of job A changed, both jobs have their own owner, and the report is parked
    with psycopg.connect(clean_db) as conn:
        latest = conn.execute(
            "SELECT job_id, step, run_attempt FROM latest_complete_checkpoints ORDER BY 1"
        ).fetchall()
        owners = conn.execute("SELECT job_id, owner FROM ckpt_job_owners ORDER BY 1").fetchall()
    assert latest == [("job-a", 20, 0), ("job-b", 5, 0)]
    assert owners == [("job-a", TEAM_A), ("job-b", TEAM_B)]
    assert queue_depth(team_a, queues.dlq_url).visible == 1
    (parked,) = team_a.receive_message(
        QueueUrl=queues.dlq_url, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    attributes = parked["MessageAttributes"]
    assert attributes[envelope.ERROR_CLASS]["StringValue"] == "ForeignSender"
    reason = attributes[envelope.ERROR_MESSAGE]["StringValue"]
    assert TEAM_A in reason and TEAM_B in reason
    assert attributes[envelope.ORIGINAL_SENDER_ID]["StringValue"] == TEAM_B
    assert parked["Body"] == foreign


@pytest.mark.slow
def test_a_replay_by_the_replay_role_applies_the_owners_report_and_never_the_strangers(
    localstack_endpoint: str, clean_db: str
) -> None:
    team_a, team_b = (
        sqs_client(localstack_endpoint, TEAM_A),
        sqs_client(localstack_endpoint, TEAM_B),
    )
    operator = sqs_client(localstack_endpoint, OPERATOR)
    queues = create_pipeline_queues(team_a, prefix=f"r{uuid.uuid4().hex[:10]}")
    settings = WriterSettings(
        database_url=clean_db, dlq_url=queues.dlq_url, replay_principal_id=OPERATOR
    )
    _send(team_a, queues.queue_url, body(step=10, world_size=1), "a:0")
    _drain(localstack_endpoint, queues, settings)
    # GIVEN one report of team A's the database refused (a constraint, fixed later) and one of
    # team B's for team A's job, both parked
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE training_checkpoint_shards ADD CONSTRAINT h4_no_bad"
            " CHECK (uri NOT LIKE '%%bad%%') NOT VALID"
        )
    _send(team_a, queues.queue_url, body(step=30, world_size=1, uri="s3://b/bad/30"), "a:0")
    _send(team_b, queues.queue_url, body(step=10, world_size=1, run_attempt=1), "b:0")
    _drain(localstack_endpoint, queues, settings)
    assert queue_depth(team_a, queues.dlq_url).visible == 2
    with psycopg.connect(clean_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE training_checkpoint_shards DROP CONSTRAINT h4_no_bad")
    # WHEN the replay role re-sends both (the stranger's too: --after-transfer, no transfer made)
    summary = replay_dlq(
        operator,
        dlq_url=queues.dlq_url,
        queue_url=queues.queue_url,
        replay_filter=ReplayFilter(after_transfer=True),
    )
    assert summary.moved == 2
    _drain(localstack_endpoint, queues, settings)
    # THEN team A's report is written as team A's, and team B's is refused again, still its own
    with psycopg.connect(clean_db) as conn:
        shards = conn.execute(
            "SELECT step, run_attempt FROM training_checkpoint_shards ORDER BY 1"
        ).fetchall()
        owners = conn.execute("SELECT job_id, owner FROM ckpt_job_owners").fetchall()
    assert shards == [(10, 0), (30, 0)]
    assert owners == [("job-a", TEAM_A)]
    (parked,) = team_a.receive_message(
        QueueUrl=queues.dlq_url, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert parked["MessageAttributes"][envelope.ORIGINAL_SENDER_ID]["StringValue"] == TEAM_B
    assert parked["MessageAttributes"][envelope.ERROR_CLASS]["StringValue"] == "ForeignSender"
