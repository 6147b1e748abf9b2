"""Writer fixtures: real SQS event shapes from moto, the handler pointed at a real database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from ckpt_pipeline.local_sqs import PipelineQueues
from ckpt_pipeline.sqs_events import receive_kwargs, sqs_event
from lambda_writer import handler as handler_module
from tests.lambda_writer.helpers import EventFactory, Outgoing


@pytest.fixture
def make_event(sqs: Any, pipeline_queues: PipelineQueues) -> EventFactory:
    """Send real messages to moto's FIFO queue, receive them, and build Lambda's SQS event."""

    def build(messages: Sequence[Outgoing | str]) -> dict[str, Any]:
        outgoing = [m if isinstance(m, Outgoing) else Outgoing(m) for m in messages]
        for m in outgoing:
            sqs.send_message(
                QueueUrl=pipeline_queues.queue_url,
                MessageBody=m.body,
                MessageGroupId=m.group_id,
                MessageDeduplicationId=m.dedup_id or uuid.uuid4().hex,
            )
        received: list[dict[str, Any]] = []
        while len(received) < len(outgoing):
            got = sqs.receive_message(
                QueueUrl=pipeline_queues.queue_url,
                **receive_kwargs(
                    max_messages=min(10, len(outgoing) - len(received)),
                    wait_time_s=1,
                    visibility_timeout_s=600,
                ),
            ).get("Messages", [])
            assert got, f"moto returned {len(received)} of {len(outgoing)} messages"
            received.extend(got)
        # Acknowledge at once (as the event source does after a batch) so the FIFO groups are
        # free for the test's next event; the handler only ever sees the event.
        for m in received:
            sqs.delete_message(QueueUrl=pipeline_queues.queue_url, ReceiptHandle=m["ReceiptHandle"])
        return sqs_event(received, queue_arn=pipeline_queues.queue_arn)

    return build


@pytest.fixture
def writer_env(
    monkeypatch: pytest.MonkeyPatch, clean_db: str, pipeline_queues: PipelineQueues
) -> Iterator[str]:
    """The handler's env: DATABASE_URL = the clean test DB, DLQ_URL = this test's DLQ."""
    monkeypatch.setenv("DATABASE_URL", clean_db)
    monkeypatch.setenv("DLQ_URL", pipeline_queues.dlq_url)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    handler_module.get_writer.cache_clear()
    yield clean_db
    handler_module.get_writer().connection.discard()
    handler_module.get_writer.cache_clear()
