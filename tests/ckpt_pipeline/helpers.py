"""Test-local pieces: message senders and small handlers standing in for the writer."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from tests import reports


def report(job_id: str, step: int, rank: int, *, world_size: int = 2, attempt: int = 0) -> str:
    """A valid ckpt.v1 body."""
    return reports.body(
        job_id=job_id, run_attempt=attempt, step=step, epoch=step, rank=rank,
        world_size=world_size, uri=f"file:///ckpt/{job_id}/{step}/{rank}.pt", loss=0.5,
        metrics={}, created_at=datetime.now(UTC),
    )  # fmt: skip


def send(sqs: Any, queue_url: str, bodies: Iterable[tuple[str, str, str]]) -> list[str]:
    """Send (body, group, dedup id) triples one by one; returns the MessageIds."""
    return [
        sqs.send_message(
            QueueUrl=queue_url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=dedup
        )["MessageId"]
        for body, group, dedup in bodies
    ]


class RecordingHandler:
    """Records every record it sees; ``decide(record) -> bool`` says whether it succeeded."""

    def __init__(self, decide: Callable[[dict[str, Any]], bool] = lambda r: True) -> None:
        self.decide = decide
        self.calls: list[list[dict[str, Any]]] = []
        self.succeeded: list[str] = []
        self.contexts: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = event["Records"]
        failures = []
        with self._lock:
            self.calls.append(records)
            self.contexts.append(context)
            for record in records:
                if self.decide(record):
                    self.succeeded.append(record["body"])
                else:
                    failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    def bodies_seen(self) -> list[str]:
        with self._lock:
            return [r["body"] for call in self.calls for r in call]


def body_of(record: dict[str, Any]) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(record["body"])
    return decoded
