"""The writer of the two-principal scenarios on LocalStack, in this process or as a child one.

As a child (``python -m tests.e2e.principals_writer ENDPOINT QUEUE_URL QUEUE_ARN DLQ_URL DB_URL``)
it is an execution environment the test SIGKILLs mid-batch: it receives under the writer's own
access key, writes, and deletes what it wrote, like the local event source's Lambda does.
"""

from __future__ import annotations

import sys
from typing import Any

import boto3

from ckpt_pipeline.local.event_source import EventSourceStats, LocalEventSource
from lambda_writer import WriterSettings
from lambda_writer.writer.batch import CheckpointWriter
from lambda_writer.writer.dlq import DeadLetterQueue
from lambda_writer.writer.records import parse_event

# Account ids LocalStack takes from 12-digit access key ids: each key is a principal of its own.
TEAM_A = "111111111111"
TEAM_B = "222222222222"
WRITER = "333333333333"  # the writer's role (it sends poison to the DLQ)
OPERATOR = "444444444444"  # the operators' replay role
# Locally a failed record comes back within seconds (tests/e2e/helpers.py's reason).
VISIBILITY_TIMEOUT_S = 3


def sqs_client(endpoint: str, access_key: str) -> Any:
    """LocalStack's SQS as the principal of ``access_key``."""
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key="test",
    )


def drain(
    endpoint: str, queue_url: str, queue_arn: str, settings: WriterSettings, *,
    until_empty_for_s: float, timeout: float,
) -> EventSourceStats:  # fmt: skip
    """The real writer fed by the local event source until the queue stayed empty."""
    sqs = sqs_client(endpoint, WRITER)
    writer = CheckpointWriter(settings, dlq=DeadLetterQueue(sqs, settings.dlq_url or ""))

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return writer.process(parse_event(event)).batch_response()

    try:
        source = LocalEventSource(
            sqs, queue_url=queue_url, queue_arn=queue_arn, handler=handler, wait_time_s=1,
            lambda_timeout_s=float(VISIBILITY_TIMEOUT_S),
        )  # fmt: skip
        return source.drain(until_empty_for_s=until_empty_for_s, timeout=timeout)
    finally:
        writer.connection.discard()


def main(argv: list[str]) -> int:
    endpoint, queue_url, queue_arn, dlq_url, database_url = argv
    settings = WriterSettings(
        database_url=database_url, dlq_url=dlq_url, replay_principal_id=OPERATOR
    )
    drain(endpoint, queue_url, queue_arn, settings, until_empty_for_s=60, timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
