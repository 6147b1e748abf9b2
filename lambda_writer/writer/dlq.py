"""Poison records to the FIFO DLQ, in the envelope ``ckpt_contract.dlq`` defines.

The body is the original body unchanged and the group is the original group, so a replay
re-drives exactly what was sent; the reason goes in the envelope's message attributes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

from ckpt_contract import dlq as envelope
from ckpt_contract.dlq import MAX_ERROR_MESSAGE_CHARS, dlq_dedup_id
from ckpt_contract.message import MAX_SQS_BATCH_ENTRIES
from lambda_writer.writer.records import Poison

logger = logging.getLogger(__name__)

# SendMessageBatch: at most MAX_SQS_BATCH_ENTRIES entries, and the message size limit (1 MiB)
# applies to each message and to the whole batch
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
MAX_BATCH_BYTES = 1024 * 1024
# SQS accepts only these characters in bodies and attribute values
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessage.html).
_NOT_SQS_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(value: str, limit: int) -> str:
    clean = _NOT_SQS_TEXT.sub("?", value)
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def dlq_entry(poison: Poison, entry_id: str) -> dict[str, Any]:
    """The SendMessageBatch entry for one poison record."""
    msg = poison.message
    error_class = _text(poison.error_class, envelope.MAX_ERROR_CLASS_CHARS)
    reason = _text(poison.reason or poison.error_class, MAX_ERROR_MESSAGE_CHARS)
    attributes: dict[str, dict[str, str]] = {
        envelope.ERROR_CLASS: {"DataType": "String", "StringValue": error_class},
        envelope.ERROR_MESSAGE: {"DataType": "String", "StringValue": reason},
        envelope.ORIGINAL_MESSAGE_ID: {"DataType": "String", "StringValue": msg.message_id},
        envelope.RECEIVE_COUNT: {"DataType": "Number", "StringValue": str(msg.receive_count)},
    }
    if msg.first_seen_at is not None:
        attributes[envelope.FIRST_SEEN_AT] = {
            "DataType": "String",
            "StringValue": msg.first_seen_at,
        }
    if msg.source_arn:
        attributes[envelope.SOURCE_QUEUE_ARN] = {
            "DataType": "String",
            "StringValue": msg.source_arn,
        }
    if msg.sender_id:
        attributes[envelope.ORIGINAL_SENDER_ID] = {
            "DataType": "String",
            "StringValue": _text(msg.sender_id, MAX_ERROR_MESSAGE_CHARS),
        }
    return {
        "Id": entry_id,
        "MessageBody": msg.body,
        # An empty group would be rejected by a FIFO queue; a record always has one in practice.
        "MessageGroupId": msg.group_id or "ckpt-dlq-unknown-group",
        "MessageDeduplicationId": dlq_dedup_id(msg.message_id),
        "MessageAttributes": attributes,
    }


def entry_size(entry: dict[str, Any]) -> int:
    """Bytes an entry counts against the message/batch size limit (body + attributes)."""
    size = len(str(entry["MessageBody"]).encode())
    for name, value in entry["MessageAttributes"].items():
        size += len(name.encode()) + len(value["DataType"].encode())
        size += len(value["StringValue"].encode())
    return size


def chunk_entries(entries: Sequence[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Greedy batches of ≤ 10 entries and ≤ 1 MiB, in order."""
    chunk: list[dict[str, Any]] = []
    used = 0
    for entry in entries:
        size = entry_size(entry)
        if chunk and (len(chunk) == MAX_SQS_BATCH_ENTRIES or used + size > MAX_BATCH_BYTES):
            yield chunk
            chunk, used = [], 0
        chunk.append(entry)
        used += size
    if chunk:
        yield chunk


class DeadLetterQueue:
    """Sends poison records to one FIFO DLQ with SendMessageBatch."""

    def __init__(self, sqs: Any, queue_url: str) -> None:
        self._sqs = sqs
        self.queue_url = queue_url

    def send(self, poisons: Sequence[Poison]) -> set[str]:
        """Send every poison record; returns the messageIds that did NOT reach the DLQ.

        A 200 response can still fail single entries, so each entry's result is checked; a call
        that fails as a whole fails all of its entries. Nothing is dropped silently: the caller
        reports the returned ids as batch item failures.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        by_entry = {f"p{i}": p for i, p in enumerate(poisons)}
        entries = [dlq_entry(p, entry_id) for entry_id, p in by_entry.items()]
        failed: set[str] = set()
        for chunk in chunk_entries(entries):
            try:
                response = self._sqs.send_message_batch(QueueUrl=self.queue_url, Entries=chunk)
            except (BotoCoreError, ClientError) as exc:
                logger.error("DLQ send failed for %d records: %s", len(chunk), exc)
                failed.update(by_entry[e["Id"]].message.message_id for e in chunk)
                continue
            for result in response.get("Failed", []):
                poison = by_entry[result["Id"]]
                logger.error(
                    "DLQ rejected record %s: %s %s",
                    poison.message.message_id,
                    result.get("Code"),
                    result.get("Message"),
                )
                failed.add(poison.message.message_id)
        return failed


def dead_letter_queue(queue_url: str, *, region: str | None) -> DeadLetterQueue:
    """A :class:`DeadLetterQueue` whose client keeps within the writer's budget (``aws.py``)."""
    # deferred: only an execution environment that sees poison pays for boto3
    from lambda_writer.shared.aws import client

    return DeadLetterQueue(client("sqs", region=region), queue_url)
