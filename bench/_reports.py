"""The benchmarks' reports: one factory for every bench's ckpt.v1 bodies, SQS entries and the
records the writer decodes from them."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from ckpt_contract import CheckpointReport, encode
from lambda_writer.records import SqsMessage, ValidReport, classify

QUEUE_ARN = "arn:aws:sqs:us-east-1:000000000000:bench.fifo"


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
                               "SequenceNumber": str(n + 1)},
                "eventSourceARN": QUEUE_ARN,
            }
            for n, rep in enumerate(reports)
        ]
    }  # fmt: skip


def decoded(reports: Iterable[CheckpointReport]) -> list[ValidReport]:
    """``reports`` as the writer decodes them from its event (each one a fresh message id)."""
    out = []
    for rep in reports:
        message = SqsMessage(
            message_id=str(uuid.uuid4()), body=encode(rep), group_id=rep.group_id,
            receive_count=1, first_receive_ms=None, sequence_number=None, source_arn=QUEUE_ARN,
        )  # fmt: skip
        valid = classify(message)
        if not isinstance(valid, ValidReport):
            raise ValueError(f"bench: a generated report is refused by the writer: {valid}")
        out.append(valid)
    return out
