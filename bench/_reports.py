"""The benchmarks' reports: one factory for every bench's ckpt.v1 bodies, SQS entries and Lambda
events, and the writer's execution environment that the write benches hand the events to."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from ckpt_contract import CheckpointReport, encode
from ckpt_pipeline.local.lambda_context import LocalLambdaContext
from lambda_writer import WriterHandler, WriterSettings, make_handler

QUEUE_ARN = "arn:aws:sqs:us-east-1:000000000000:bench.fifo"
# The principal the events come from (an instance profile's role and session, as SQS stamps it):
# every job of a bench run is this principal's (the writer's ownership check, migration 0015).
SENDER_ID = "AROABENCHROLEEXAMPLE:i-0bench"


def report(
    job_id: str, step: int, rank: int, world_size: int, *, created_at: datetime | None = None,
    **fields: Any,
) -> CheckpointReport:  # fmt: skip
    """One rank's report of ``step`` (epoch 0, attempt 0, a file URI and loss 0.5 unless given)."""
    uri = f"file:///bench/{job_id}/{step}/{rank}.pt"
    values: dict[str, Any] = {"run_attempt": 0, "epoch": 0, "uri": uri, "loss": 0.5}
    return CheckpointReport.create(
        job_id=job_id, step=step, rank=rank, world_size=world_size,
        created_at=created_at or datetime.now(UTC), **(values | fields),
    )  # fmt: skip


def checkpoint(job_id: str, step: int, world_size: int, **fields: Any) -> list[CheckpointReport]:
    """Every rank's report of one checkpoint."""
    now = datetime.now(UTC)
    return [
        report(job_id, step, r, world_size, created_at=now, **fields) for r in range(world_size)
    ]


def send_entry(rep: CheckpointReport, entry_id: str = "0") -> dict[str, str]:
    """One ``SendMessageBatch`` entry, as the reporter sends it (one entry per call)."""
    return {
        "Id": entry_id, "MessageBody": encode(rep), "MessageGroupId": rep.group_id,
        "MessageDeduplicationId": rep.dedup_id,
    }  # fmt: skip


def lambda_event(reports: Iterable[CheckpointReport]) -> dict[str, Any]:
    """Lambda's SQS event of ``reports``, as the FIFO event source delivers them."""
    now_ms = str(int(datetime.now(UTC).timestamp() * 1000))
    return {
        "Records": [
            {
                "messageId": str(uuid.uuid4()), "body": encode(rep),
                "attributes": {"MessageGroupId": rep.group_id, "ApproximateReceiveCount": "1",
                               "ApproximateFirstReceiveTimestamp": now_ms,
                               "SequenceNumber": str(n + 1), "SenderId": SENDER_ID},
                "eventSourceARN": QUEUE_ARN,
            }
            for n, rep in enumerate(reports)
        ]
    }  # fmt: skip


def events(reports: Sequence[CheckpointReport], batch: int) -> list[dict[str, Any]]:
    """``reports`` as the event source delivers them: events of ``batch`` records (FIFO: 10)."""
    return [lambda_event(reports[i : i + batch]) for i in range(0, len(reports), batch)]


def writer_environment(database_url: str) -> WriterHandler:
    """One execution environment of the writer (its own connection, opened on the first batch),
    built as the local pipeline builds it: explicit settings, no EMF, warnings only."""
    settings = WriterSettings(database_url=database_url)
    return make_handler(settings, emit_metrics=False, log_level="WARNING")


def invoke(handler: WriterHandler, event: dict[str, Any]) -> None:
    """One invocation, as Lambda makes it; a record the writer did not write is an error here."""
    response = handler(event, LocalLambdaContext())
    if response["batchItemFailures"]:
        raise RuntimeError(f"bench: the writer failed records: {response['batchItemFailures']}")
