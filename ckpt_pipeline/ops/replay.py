"""Move messages from the FIFO DLQ back to the main queue, with reasons, filters and a dry run.

SQS's own redrive (``StartMessageMoveTask``) moves a whole DLQ at up to 500 messages/s but cannot
filter, list reasons or dry run; :mod:`ckpt_pipeline.ops.replay_redrive` uses it, when it is safe,
for "move everything". This module is the path for everything else.

Safe to interrupt and re-run: a message is deleted from the DLQ only after its send succeeded, and
the new deduplication id is deterministic (``<original id>:replay:<n>``, n carried in the
``ReplayCount`` attribute), so a re-run after a crash between send and delete re-sends the same id
and SQS drops the copy within its 5-minute window; beyond that the writer's idempotent UPSERTs
absorb it. The original MessageGroupId is kept, so per-rank order holds.

Complete: a FIFO queue returns none of a group's later messages while earlier ones are in flight
(until those are deleted or visible again; measured on moto and LocalStack too), so keeping
a listed or skipped message invisible would hide the rest of its group. Each message that stays in
the DLQ (listed in a dry run, or skipped by a filter) is therefore re-queued at the end of its
group (sent again, then the original deleted; body, group, attributes and replay identity kept,
new MessageId) and the run goes on until every group has come round to its own copies. The DLQ
ends with the same messages in the same order per group. Everything received and not deleted is
released (visibility 0) when the run ends, also on Ctrl-C.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from ckpt_contract.dlq import dlq_dedup_id
from ckpt_pipeline.exceptions import PipelineError
from ckpt_pipeline.ops.replay_plan import (
    DlqMessage,
    ReplayDecision,
    ReplayFilter,
    decide_replay,
    replay_identity,
    replay_message_attributes,
    requeue_entry,
    requeue_tag,
)
from ckpt_pipeline.ops.sqs import QueueDepth, queue_depth

logger = logging.getLogger(__name__)

# A batch must be re-sent well within this, or it shows up again in the same run.
DEFAULT_VISIBILITY_TIMEOUT_S = 60
_RECEIVE_WAIT_S = 1
_SQS_BATCH = 10

Outcome = Literal["moved", "would-move", "skipped", "failed", "refused", "discarded"]
# Records DLQ messages as discarded (in the database) before they are deleted; raises when the
# record did not commit (those messages stay in the DLQ).
Discard = Callable[[list[DlqMessage]], None]


@dataclass(frozen=True)
class ReplayItem:
    """The result for one DLQ message."""

    message: DlqMessage
    outcome: Outcome
    detail: str = ""
    new_dedup_id: str | None = None


@dataclass
class ReplaySummary:
    """Counts and per-message results of one replay run, and what is left in the DLQ after it."""

    items: list[ReplayItem] = field(default_factory=list)
    interrupted: bool = False
    limit_reached: bool = False
    # SQS's (approximate) counts of the DLQ once the run released what it held.
    left: QueueDepth | None = None

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
    def refused(self) -> int:
        return self.count("refused")

    @property
    def discarded(self) -> int:
        return self.count("discarded")

    @property
    def would_move(self) -> int:
        return self.count("would-move")

    @property
    def not_reached(self) -> int:
        """Messages left in the DLQ that this run did not list, skip or fail on."""
        if self.left is None:
            return 0
        return max(0, self.left.total - self.skipped - self.would_move - self.failed - self.refused)


ItemCallback = Callable[[ReplayItem], None]


@dataclass
class _Run:
    sqs: Any
    dlq_url: str
    run_id: str
    record: ItemCallback
    # Received and not deleted, by receipt handle: all released when the run ends.
    held: dict[str, DlqMessage] = field(default_factory=dict)
    # The DLQ dedup ids a writer gives the messages this run sent to the main queue, should it
    # dead-letter them again (ckpt_contract.dlq.dlq_dedup_id of the main queue's MessageId).
    sent_back: set[str] = field(default_factory=set)

    def deleted(self, message: DlqMessage) -> None:
        self.held.pop(message.receipt_handle, None)


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
    should_stop: Callable[[], bool] = lambda: False,
    discard: Discard | None = None,
) -> ReplaySummary:
    """List (``dry_run``) or move the DLQ messages that pass the filter; returns the summary.

    ``should_stop`` is asked before each receive (the CLI's SIGINT handler sets it); a
    KeyboardInterrupt also ends the run with what was done so far (``interrupted``).
    ``after_send`` runs after a message's send succeeded and before its delete; the tests use
    it to interrupt a replay at its most delicate point. With ``discard``, the selected messages
    (``foreign sender`` ones included) are discarded instead of moved: recorded by ``discard``,
    then deleted from the DLQ.
    """
    if not dry_run and not queue_url and discard is None:
        raise ValueError("queue_url is required unless dry_run")
    replay_filter = replay_filter or ReplayFilter()
    summary = ReplaySummary()
    run_id = uuid.uuid4().hex[:16]
    tag = requeue_tag(run_id)

    def record(item: ReplayItem) -> None:
        summary.items.append(item)
        if on_item is not None:
            on_item(item)

    run = _Run(sqs, dlq_url, run_id, record)
    seen: set[str] = set()

    selected = 0
    try:
        while True:
            if should_stop():
                summary.interrupted = True
                break
            if limit is not None and selected >= limit:
                summary.limit_reached = True
                break
            response = sqs.receive_message(
                QueueUrl=dlq_url,
                MaxNumberOfMessages=_SQS_BATCH,
                WaitTimeSeconds=_RECEIVE_WAIT_S,
                VisibilityTimeout=visibility_timeout_s,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            received = [DlqMessage.from_sqs(m) for m in response.get("Messages", [])]
            run.held.update((m.receipt_handle, m) for m in received)
            # A copy this run re-queued means its group has come round: it stays held.
            fresh = [
                m
                for m in received
                if m.message_id not in seen and not (m.dedup_id or "").startswith(tag)
            ]
            if not fresh:
                break
            to_move: list[ReplayDecision] = []
            to_requeue: list[DlqMessage] = []
            for message in fresh:
                seen.add(message.message_id)
                if message.dedup_id in run.sent_back:
                    # A writer running beside the run (a poller, the deployed Lambda) received
                    # what this run moved and dead-lettered it again: moving it again would
                    # loop it. Held, released at the end: it stays for the next run.
                    record(ReplayItem(message, "skipped", CAME_BACK))
                    continue
                decision = decide_replay(
                    message, replay_filter, selected_so_far=selected, limit=limit
                )
                if decision.action == "skip":
                    record(ReplayItem(message, "skipped", decision.why))
                    to_requeue.append(message)
                    continue
                if decision.action == "refuse" and (dry_run or discard is None):
                    record(ReplayItem(message, "refused", decision.why))
                    to_requeue.append(message)
                    continue
                selected += 1
                if dry_run:
                    identity = replay_identity(message)
                    record(ReplayItem(message, "would-move", new_dedup_id=identity.dedup_id))
                    to_requeue.append(message)
                else:
                    to_move.append(decision)
            if to_move and discard is not None:
                _discard(run, [d.message for d in to_move], discard)
            elif to_move:
                assert queue_url is not None
                _move(run, queue_url, to_move, after_send)
            if to_requeue:
                _requeue(run, to_requeue)
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        _release(sqs, dlq_url, list(run.held.values()))
    summary.left = queue_depth(sqs, dlq_url)
    return summary


CAME_BACK = (
    "came back to the DLQ during this run: a writer (poll, the Lambda) received it from the"
    " queue and dead-lettered it again; not moved twice, left for the next replay"
)


def _move(
    run: _Run,
    queue_url: str,
    decisions: list[ReplayDecision],
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
        result = run.sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
    except (BotoCoreError, ClientError) as exc:
        result = {"Failed": [{"Id": key, "Message": str(exc)} for key in messages]}
    # An HTTP 200 can still carry per-entry failures: those stay in the DLQ.
    for failure in result.get("Failed", []):
        message = messages[failure["Id"]]
        run.record(ReplayItem(message, "failed", f"send failed: {failure.get('Message', '')}"))
        logger.warning("replay of %s failed: %s", message.message_id, failure.get("Message"))
    sent = [e["Id"] for e in result.get("Successful", [])]
    run.sent_back.update(dlq_dedup_id(e["MessageId"]) for e in result.get("Successful", []))
    if after_send is not None:
        for key in sent:
            after_send(messages[key])
    deleted = _delete(run, [messages[key] for key in sent])
    for key in sent:
        message = messages[key]
        if message.receipt_handle in deleted:
            run.record(ReplayItem(message, "moved", new_dedup_id=identities[key].dedup_id))
        else:
            # Sent but still in the DLQ: a re-run sends the same dedup id again, so no duplicate
            # within 5 minutes and an idempotent write after that.
            run.record(
                ReplayItem(
                    message,
                    "failed",
                    "sent, but not deleted from the DLQ",
                    identities[key].dedup_id,
                )
            )


def _discard(run: _Run, messages: list[DlqMessage], discard: Discard) -> None:
    """Record the messages as discarded, then delete them: never deleted unless recorded."""
    try:
        discard(messages)
    except PipelineError as exc:  # the record did not commit: every message stays in the DLQ
        for message in messages:
            run.record(ReplayItem(message, "failed", f"not discarded: {exc}"))
        return
    deleted = _delete(run, messages)
    for message in messages:
        if message.receipt_handle in deleted:
            run.record(ReplayItem(message, "discarded"))
        else:
            # Recorded, still in the DLQ: a re-run records it once more as the same row.
            run.record(ReplayItem(message, "failed", "recorded, but not deleted from the DLQ"))


def _requeue(run: _Run, messages: list[DlqMessage]) -> None:
    """Send each message to the end of its group in the DLQ, then delete the original."""
    entries = {}
    for i, message in enumerate(messages):
        entry = requeue_entry(message, run.run_id, str(i))
        if entry is None:
            # Stays held: its group's later messages are not reached (counted as not reached).
            logger.warning("cannot re-queue %s in the DLQ", message.message_id)
            continue
        entries[str(i)] = entry
    if not entries:
        return
    try:
        result = run.sqs.send_message_batch(QueueUrl=run.dlq_url, Entries=list(entries.values()))
    except (BotoCoreError, ClientError) as exc:
        logger.warning("could not re-queue %d DLQ messages: %s", len(entries), exc)
        return
    for failure in result.get("Failed", []):
        logger.warning("could not re-queue a DLQ message: %s", failure.get("Message"))
    _delete(run, [messages[int(e["Id"])] for e in result.get("Successful", [])])


def _delete(run: _Run, messages: list[DlqMessage]) -> set[str]:
    """Delete from the DLQ; returns the receipt handles that were deleted."""
    if not messages:
        return set()
    entries = [{"Id": str(i), "ReceiptHandle": m.receipt_handle} for i, m in enumerate(messages)]
    try:
        result = run.sqs.delete_message_batch(QueueUrl=run.dlq_url, Entries=entries)
    except (BotoCoreError, ClientError) as exc:
        logger.warning("could not delete %d DLQ messages: %s", len(entries), exc)
        return set()
    done = {messages[int(e["Id"])].receipt_handle for e in result.get("Successful", [])}
    for message in messages:
        if message.receipt_handle in done:
            run.deleted(message)
    return done


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
