"""DLQ replay decisions, apart from I/O: what a DLQ message is, which to move, its new dedup id."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Message attributes the writer puts on a poison message it sends to the DLQ.
ERROR_CLASS_ATTR = "ErrorClass"
ERROR_MESSAGE_ATTR = "ErrorMessage"
DLQ_ANNOTATIONS = frozenset(
    {
        ERROR_CLASS_ATTR,
        ERROR_MESSAGE_ATTR,
        "OriginalMessageId",
        "FirstSeenAt",
        "SourceQueueArn",
        "ReceiveCount",
    }
)
# Carried on every replayed message so that the next replay of it computes the next number.
REPLAY_COUNT_ATTR = "ReplayCount"
REPLAY_OF_ATTR = "ReplayOf"
# "The maximum length of MessageDeduplicationId is 128 characters"
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessage.html).
MAX_DEDUP_ID_CHARS = 128
_REPLAY_SUFFIX = re.compile(r"^(?P<base>.+):replay:(?P<n>\d+)$")

Action = Literal["move", "skip"]


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
        )

    def string_attribute(self, name: str) -> str | None:
        value = self.message_attributes.get(name, {}).get("StringValue")
        return value if isinstance(value, str) else None

    @property
    def job_id(self) -> str | None:
        return job_id_of(self.body)

    @property
    def error_class(self) -> str | None:
        return self.string_attribute(ERROR_CLASS_ATTR)

    @property
    def reason(self) -> str:
        """The failure reason the writer recorded, or SQS's redrive when it recorded none."""
        error_class = self.error_class
        if error_class is None:
            return f"maxReceiveCount exceeded (received {self.receive_count} times)"
        message = self.string_attribute(ERROR_MESSAGE_ATTR)
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
        original = message.dedup_id or message.message_id
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
    return kept | {
        REPLAY_COUNT_ATTR: {"DataType": "Number", "StringValue": str(identity.number)},
        REPLAY_OF_ATTR: {"DataType": "String", "StringValue": identity.base},
    }


@dataclass(frozen=True)
class ReplayDecision:
    """What the replay does with one DLQ message."""

    message: DlqMessage
    action: Action
    why: str = ""


def decide(
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
    return ReplayDecision(message, "move")
