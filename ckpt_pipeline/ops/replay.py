"""Move messages from the FIFO DLQ back to the main queue, with reasons, filters and a dry run.

SQS's own redrive (``StartMessageMoveTask``, available for FIFO queues since late 2023) moves a
whole DLQ back at up to 500 messages/s with new MessageIds, but cannot filter, list reasons or dry
run (and moto does not implement it). Use it when everything should go back; use this when only
the messages of one job, or of one fixed failure, should.

Safe to interrupt and re-run: a message is deleted from the DLQ only after its send succeeded, and
the new deduplication id is deterministic (``<original id>:replay:<n>``, n carried in the
``ReplayCount`` attribute), so a re-run after a crash between send and delete re-sends the same id
and SQS drops the copy within its 5-minute window; beyond that the writer's idempotent UPSERTs
absorb it. The original MessageGroupId is kept, so per-rank order holds.

A FIFO DLQ locks a message group while any of its messages is in flight: a skipped message is
held (invisible) until the run ends, so later messages of its group are only seen if they came
in the same receive. Skipped messages are released (made visible) when the run ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from ckpt_pipeline.ops.replay_plan import (
    DlqMessage,
    ReplayDecision,
    ReplayFilter,
    decide,
    replay_identity,
    replay_message_attributes,
)

logger = logging.getLogger(__name__)

# A batch must be re-sent well within this, or it shows up again in the same run.
DEFAULT_VISIBILITY_TIMEOUT_S = 60
_RECEIVE_WAIT_S = 1
_SQS_BATCH = 10

Outcome = Literal["moved", "would-move", "skipped", "failed"]


@dataclass(frozen=True)
class ReplayItem:
    """The result for one DLQ message."""

    message: DlqMessage
    outcome: Outcome
    detail: str = ""
    new_dedup_id: str | None = None


@dataclass
class ReplaySummary:
    """Counts and per-message results of one replay run."""

    items: list[ReplayItem] = field(default_factory=list)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for item in self.items if item.outcome == outcome)

    @property
    def moved(self) -> int:
        return self.count("moved")

    @property
    def skipped(self) -> int:
        return self.count("skipped")

    @property
    def failed(self) -> int:
        return self.count("failed")

    @property
    def would_move(self) -> int:
        return self.count("would-move")


ItemCallback = Callable[[ReplayItem], None]


def replay_dlq(
    sqs: Any,
    *,
    dlq_url: str,
    queue_url: str | None,
    replay_filter: ReplayFilter | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    visibility_timeout_s: int = DEFAULT_VISIBILITY_TIMEOUT_S,
    on_item: ItemCallback | None = None,
    after_send: Callable[[DlqMessage], None] | None = None,
) -> ReplaySummary:
    """List (``dry_run``) or move the DLQ messages that pass the filter; returns the summary.

    ``after_send`` runs after a message's send succeeded and before its delete; the tests use
    it to interrupt a replay at its most delicate point.
    """
    if not dry_run and not queue_url:
        raise ValueError("queue_url is required unless dry_run")
    replay_filter = replay_filter or ReplayFilter()
    summary = ReplaySummary()
    seen: set[str] = set()
    held: list[DlqMessage] = []  # received, not deleted: released when the run ends
    selected = 0

    def record(item: ReplayItem) -> None:
        summary.items.append(item)
        if on_item is not None:
            on_item(item)

    try:
        while limit is None or selected < limit:
            response = sqs.receive_message(
                QueueUrl=dlq_url,
                MaxNumberOfMessages=_SQS_BATCH,
                WaitTimeSeconds=_RECEIVE_WAIT_S,
                VisibilityTimeout=visibility_timeout_s,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            fresh = [
                DlqMessage.from_sqs(m)
                for m in response.get("Messages", [])
                if m["MessageId"] not in seen
            ]
            if not fresh:
                break
            to_move: list[ReplayDecision] = []
            for message in fresh:
                seen.add(message.message_id)
                decision = decide(message, replay_filter, selected_so_far=selected, limit=limit)
                if decision.action == "skip":
                    held.append(message)
                    record(ReplayItem(message, "skipped", decision.why))
                    continue
                selected += 1
                if dry_run:
                    held.append(message)
                    record(
                        ReplayItem(
                            message, "would-move", new_dedup_id=replay_identity(message).dedup_id
                        )
                    )
                else:
                    to_move.append(decision)
            if to_move:
                assert queue_url is not None
                _move(sqs, dlq_url, queue_url, to_move, held, record, after_send)
    finally:
        _release(sqs, dlq_url, held)
    return summary


def _move(
    sqs: Any,
    dlq_url: str,
    queue_url: str,
    decisions: list[ReplayDecision],
    held: list[DlqMessage],
    record: ItemCallback,
    after_send: Callable[[DlqMessage], None] | None,
) -> None:
    messages = {str(i): d.message for i, d in enumerate(decisions)}
    identities = {key: replay_identity(m) for key, m in messages.items()}
    entries = [
        {
            "Id": key,
            "MessageBody": m.body,
            "MessageGroupId": m.group_id,
            "MessageDeduplicationId": identities[key].dedup_id,
            "MessageAttributes": replay_message_attributes(m, identities[key]),
        }
        for key, m in messages.items()
    ]
    try:
        result = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
    except (BotoCoreError, ClientError) as exc:
        result = {"Failed": [{"Id": key, "Message": str(exc)} for key in messages]}
    # An HTTP 200 can still carry per-entry failures: those stay in the DLQ.
    for failure in result.get("Failed", []):
        message = messages[failure["Id"]]
        held.append(message)
        record(ReplayItem(message, "failed", f"send failed: {failure.get('Message', '')}"))
        logger.warning("replay of %s failed: %s", message.message_id, failure.get("Message"))
    sent = [e["Id"] for e in result.get("Successful", [])]
    held.extend(messages[key] for key in sent)  # until deleted: a crash leaves them to a re-run
    if after_send is not None:
        for key in sent:
            after_send(messages[key])
    if not sent:
        return
    delete_entries = [{"Id": key, "ReceiptHandle": messages[key].receipt_handle} for key in sent]
    try:
        deleted = sqs.delete_message_batch(QueueUrl=dlq_url, Entries=delete_entries)
    except (BotoCoreError, ClientError) as exc:
        deleted = {"Failed": [{"Id": key, "Message": str(exc)} for key in sent]}
    failed_delete = {f["Id"]: f.get("Message", "") for f in deleted.get("Failed", [])}
    for key in sent:
        message = messages[key]
        if key in failed_delete:
            # Sent but still in the DLQ: a re-run sends the same dedup id again, so no duplicate
            # within 5 minutes and an idempotent write after that.
            record(
                ReplayItem(
                    message,
                    "failed",
                    f"sent, but not deleted from the DLQ: {failed_delete[key]}",
                    identities[key].dedup_id,
                )
            )
            continue
        held.remove(message)
        record(ReplayItem(message, "moved", new_dedup_id=identities[key].dedup_id))


def _release(sqs: Any, dlq_url: str, held: list[DlqMessage]) -> None:
    """Make held messages visible again now rather than at the end of their visibility timeout."""
    for start in range(0, len(held), _SQS_BATCH):
        chunk = held[start : start + _SQS_BATCH]
        entries = [
            {"Id": str(i), "ReceiptHandle": m.receipt_handle, "VisibilityTimeout": 0}
            for i, m in enumerate(chunk)
        ]
        try:
            sqs.change_message_visibility_batch(QueueUrl=dlq_url, Entries=entries)
        except (BotoCoreError, ClientError) as exc:
            # Not fatal: they become visible when their visibility timeout ends.
            logger.warning("could not release %d DLQ messages: %s", len(entries), exc)
