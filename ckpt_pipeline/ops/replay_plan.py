"""DLQ replay decisions, apart from I/O: what a DLQ message is, which to move, its new dedup id."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ckpt_contract import dlq as envelope
from ckpt_contract.dlq import dlq_dedup_id

# A listed message re-queued at the end of its group in the DLQ keeps its first DLQ dedup id here,
# so its replay identity does not change with each listing.
DLQ_DEDUP_ATTR = "DlqDedupId"
# What the DLQ put on a message (the writer's envelope, and the listing's own): not replayed.
DLQ_ANNOTATIONS = envelope.WRITER_ATTRIBUTES | {DLQ_DEDUP_ATTR}
# Carried on every replayed message so that the next replay of it computes the next number.
REPLAY_COUNT_ATTR = "ReplayCount"
REPLAY_OF_ATTR = "ReplayOf"
# "The maximum length of MessageDeduplicationId is 128 characters"
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessage.html).
MAX_DEDUP_ID_CHARS = 128
# "Each message can have up to 10 attributes"
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-message-metadata.html).
MAX_MESSAGE_ATTRIBUTES = 10
# What the listing shows (and --reason matches) for a message the writer gave no reason: a
# transient failure (database down, timeout) reaches the DLQ through maxReceiveCount.
NO_REASON = "(no reason: exhausted retries)"
# Dedup id prefix of a listed message re-queued at the end of its group by one replay run.
_REQUEUED_PREFIX = "ckpt-listed"
_REPLAY_SUFFIX = re.compile(r"^(?P<base>.+):replay:(?P<n>\d+)$")

# The writer's class for a report of a job another principal owns (lambda_writer/writer/
# repository.py, migration 0015): re-sending it cannot change the verdict.
FOREIGN_SENDER = "ForeignSender"

ReplayAction = Literal["move", "skip", "refuse"]


def job_id_of(body: str) -> str | None:
    """The ``job_id`` of a body if it is a JSON object with a string job_id; lenient otherwise."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return None
    job = decoded.get("job_id") if isinstance(decoded, dict) else None
    return job if isinstance(job, str) else None


@dataclass(frozen=True)
class DlqMessage:
    """One message received from the DLQ, with the parts the replay decides on."""

    message_id: str
    receipt_handle: str
    body: str
    group_id: str | None
    dedup_id: str | None
    receive_count: int
    message_attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source_arn: str | None = None
    # SQS's SenderId of the DLQ message: the writer's role for a message it parked; the report's
    # sender for one SQS moved after maxReceiveCount.
    sender_id: str | None = None

    @classmethod
    def from_sqs(cls, message: Mapping[str, Any]) -> DlqMessage:
        """From a boto3 ``ReceiveMessage`` message asked with all attributes."""
        system = message.get("Attributes", {})
        return cls(
            message_id=message["MessageId"],
            receipt_handle=message["ReceiptHandle"],
            body=message["Body"],
            group_id=system.get("MessageGroupId"),
            dedup_id=system.get("MessageDeduplicationId"),
            receive_count=int(system.get("ApproximateReceiveCount", 0)),
            message_attributes=dict(message.get("MessageAttributes", {})),
            source_arn=system.get("DeadLetterQueueSourceArn"),
            sender_id=system.get("SenderId"),
        )

    def string_attribute(self, name: str) -> str | None:
        value = self.message_attributes.get(name, {}).get("StringValue")
        return value if isinstance(value, str) else None

    @property
    def job_id(self) -> str | None:
        return job_id_of(self.body)

    @property
    def error_class(self) -> str | None:
        return self.string_attribute(envelope.ERROR_CLASS)

    @property
    def original_sender_id(self) -> str | None:
        """Who sent the report: the writer's envelope says it for a message the writer parked;
        a message SQS moved after maxReceiveCount was never re-sent, so its own SenderId (AWS's
        pages do not say a redrive keeps it; if not, the writer refuses the replay: it names a
        principal that owns nothing, never someone else's)."""
        recorded = self.string_attribute(envelope.ORIGINAL_SENDER_ID)
        if recorded is not None or self.error_class is not None:
            return recorded
        return self.sender_id

    @property
    def identity_dedup_id(self) -> str:
        """The dedup id the message had when it entered the DLQ (kept across re-queueing)."""
        return self.string_attribute(DLQ_DEDUP_ATTR) or self.dedup_id or self.message_id

    @property
    def reason(self) -> str:
        """The failure reason the writer recorded, or :data:`NO_REASON` when it recorded none."""
        error_class = self.error_class
        if error_class is None:
            return NO_REASON
        message = self.string_attribute(envelope.ERROR_MESSAGE)
        return f"{error_class}: {message}" if message else error_class


def compile_reason(text: str) -> re.Pattern[str]:
    """``--reason`` as a case-insensitive regex; text that is not a valid regex is a substring."""
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error:
        return re.compile(re.escape(text), re.IGNORECASE)


@dataclass(frozen=True)
class ReplayFilter:
    """Which DLQ messages to move; None matches everything."""

    job: str | None = None
    reason: re.Pattern[str] | None = None
    # Re-send ``foreign sender`` messages too (after ``jobs transfer`` made their sender the
    # job's owner; the writer judges them again by the same original sender).
    after_transfer: bool = False

    def rejects(self, message: DlqMessage) -> str | None:
        """Why ``message`` is skipped, or None if it is to be moved."""
        if self.job is not None and message.job_id != self.job:
            return f"job is {message.job_id!r}, not {self.job!r}"
        if self.reason is not None and not self.reason.search(message.reason):
            return "reason does not match"
        return None


@dataclass(frozen=True)
class ReplayIdentity:
    """The replayed message's deduplication id, and the attributes that make it deterministic."""

    dedup_id: str
    base: str
    number: int


def replay_identity(message: DlqMessage) -> ReplayIdentity:
    """``<original dedup id>:replay:<n>``, n one more than the replays this message went through.

    It depends only on the DLQ message (its attributes and dedup id), never on receive counts,
    so a replay interrupted between send and delete re-sends the same id and SQS drops the copy.
    """
    base = message.string_attribute(REPLAY_OF_ATTR)
    count_text = message.string_attribute(REPLAY_COUNT_ATTR)
    previous = int(count_text) if count_text and count_text.isdigit() else None
    if base is None or previous is None:
        original = message.identity_dedup_id
        match = _REPLAY_SUFFIX.match(original)
        if match is not None:
            # A replayed message that came back without our attributes: continue its numbering.
            base, previous = match.group("base"), int(match.group("n"))
        else:
            base, previous = base or original, previous or 0
    number = previous + 1
    dedup_id = f"{base}:replay:{number}"
    if len(dedup_id) > MAX_DEDUP_ID_CHARS:
        dedup_id = f"{hashlib.sha256(base.encode()).hexdigest()}:replay:{number}"
    return ReplayIdentity(dedup_id=dedup_id, base=base, number=number)


def replay_message_attributes(
    message: DlqMessage, identity: ReplayIdentity
) -> dict[str, dict[str, Any]]:
    """The original attributes without the DLQ annotations, plus the replay counter."""
    kept = {
        name: dict(value)
        for name, value in message.message_attributes.items()
        if name not in DLQ_ANNOTATIONS and name not in (REPLAY_COUNT_ATTR, REPLAY_OF_ATTR)
    }
    replay = {
        REPLAY_COUNT_ATTR: {"DataType": "Number", "StringValue": str(identity.number)},
        REPLAY_OF_ATTR: {"DataType": "String", "StringValue": identity.base},
    }
    original = message.original_sender_id
    if original is not None:
        # The replay is sent under the operator's principal: the writer applies this original
        # sender only when the stack's replay principal sent it (records.sent_by).
        replay[envelope.ORIGINAL_SENDER_ID] = {"DataType": "String", "StringValue": original}
    return kept | replay


@dataclass(frozen=True)
class ReplayDecision:
    """What the replay does with one DLQ message."""

    message: DlqMessage
    action: ReplayAction
    why: str = ""


def decide_replay(
    message: DlqMessage, replay_filter: ReplayFilter, *, selected_so_far: int, limit: int | None
) -> ReplayDecision:
    """Move or skip one message given the filters and the ``--limit``."""
    rejected = replay_filter.rejects(message)
    if rejected is not None:
        return ReplayDecision(message, "skip", rejected)
    if limit is not None and selected_so_far >= limit:
        return ReplayDecision(message, "skip", f"beyond --limit {limit}")
    if message.group_id is None:
        return ReplayDecision(message, "skip", "no MessageGroupId (not from a FIFO queue)")
    if message.error_class == FOREIGN_SENDER and not replay_filter.after_transfer:
        return ReplayDecision(
            message,
            "refuse",
            "refused: the job belongs to another principal and a replay keeps the original"
            " sender (transfer the job, then --after-transfer; or --discard REASON)",
        )
    return ReplayDecision(message, "move")


def requeue_tag(run_id: str) -> str:
    """The dedup id prefix marking the copies one run re-queued (so it stops when it meets one)."""
    return f"{_REQUEUED_PREFIX}:{run_id}:"


def requeue_entry(message: DlqMessage, run_id: str, entry_id: str) -> dict[str, Any] | None:
    """The SendMessageBatch entry that puts ``message`` at the end of its group in the DLQ.

    A FIFO queue shows a group's next messages only once the earlier ones are deleted, so a run
    that must see a whole group but keep its messages re-sends each one to the group's tail and
    deletes the original. Body, group and attributes are kept; the first DLQ dedup id is carried
    in :data:`DLQ_DEDUP_ATTR` so the replay identity stays the same. None when it cannot be done
    (no group: not a FIFO message; or no room for one more attribute).
    """
    if message.group_id is None:
        return None
    attributes = {
        name: {
            key: value[key] for key in ("DataType", "StringValue", "BinaryValue") if key in value
        }
        for name, value in message.message_attributes.items()
    }
    attributes[DLQ_DEDUP_ATTR] = {"DataType": "String", "StringValue": message.identity_dedup_id}
    if len(attributes) > MAX_MESSAGE_ATTRIBUTES:
        return None
    digest = hashlib.sha256(message.message_id.encode()).hexdigest()[:64]
    return {
        "Id": entry_id,
        "MessageBody": message.body,
        "MessageGroupId": message.group_id,
        "MessageDeduplicationId": requeue_tag(run_id) + digest,
        "MessageAttributes": attributes,
    }


def move_task_refusal(sample: Sequence[DlqMessage], *, whole_dlq: bool) -> str | None:
    """Why SQS's own move task could lose messages here, or None when it is safe to use.

    The move task re-sends each message with the dedup id it has in the DLQ, and a FIFO queue
    silently drops a send whose id it accepted in the last 5 minutes. AWS replaces the dedup id
    of a message it dead-letters with that message's id ("the original message's deduplication
    ID will be replaced with the original message's ID",
    https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-configure-dead-letter-queue-redrive.html)
    and the writer keys its poison copies by message id: neither can be an id the main queue has
    seen. An SQS that keeps the producer's id on redrive (LocalStack does) would have the copy
    dropped by the main queue within 5 minutes of the original send. The sample (the first
    messages of each group) must show how this SQS keys redriven messages, or be the whole DLQ.
    """
    if not sample:
        return "nothing seen in the DLQ to check"
    for message in sample:
        if message.string_attribute(envelope.ORIGINAL_SENDER_ID) is not None:
            # The move task re-sends as SQS, not as the replay principal: the writer would judge
            # the report by the wrong sender.
            return (
                f"message {message.message_id} carries its original sender, which only a replay"
                " under the replay principal applies"
            )
    redriven = 0
    for message in sample:
        writer_id = message.string_attribute(envelope.ORIGINAL_MESSAGE_ID)
        if message.error_class is not None and writer_id is not None:
            if message.dedup_id == dlq_dedup_id(writer_id):
                continue
        elif message.dedup_id == message.message_id:
            redriven += 1
            continue
        return (
            f"message {message.message_id} has dedup id {message.dedup_id!r}, which the main"
            " queue may have accepted in the last 5 minutes and would drop"
        )
    if redriven == 0 and not whole_dlq:
        return "no redriven message among the first ones to show how this SQS keys them"
    return None
