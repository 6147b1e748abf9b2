"""SQS event records as typed values, and their classification into reports or poison (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from ckpt_contract import CheckpointReport, InvalidMessage, MessageTooLarge, decode
from ckpt_contract.dlq import ORIGINAL_SENDER_ID
from ckpt_contract.kinds import is_restart_body
from ckpt_contract.pack import split_pack
from lambda_writer.writer.exceptions import MalformedEvent, PoisonRecord

if TYPE_CHECKING:
    # Imported when a restart record is first seen (classify): a batch of reports never needs
    # its model, and the handler's cold start does not pay for it.
    from ckpt_contract.restart import RestartRecord


# NamedTuples, immutable as frozen dataclasses were: a frozen dataclass compiles its methods when
# its class is created, ~0.5 ms each of the handler's import (cold start, BENCHMARKS.md §5).
class SqsMessage(NamedTuple):
    """The parts of one Lambda SQS event record the writer uses
    (https://docs.aws.amazon.com/lambda/latest/dg/with-sqs.html)."""

    message_id: str
    body: str
    group_id: str
    receive_count: int
    first_receive_ms: int | None
    sequence_number: str | None
    source_arn: str
    # SQS's SenderId (``attributes.SenderId``): an IAM user's id, or ``ROLEID:session``. After
    # :func:`sent_by`, the sender the writer judges the message by (the original one of a replay).
    sender_id: str | None = None
    # The envelope's original sender (``messageAttributes.OriginalSenderId``) a replay carries.
    original_sender_id: str | None = None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SqsMessage:
        """Read one event record; raises :class:`MalformedEvent` if it is not SQS's shape."""
        message_id = record.get("messageId")
        if not isinstance(message_id, str) or not message_id:
            raise MalformedEvent("SQS record without a messageId")
        attributes = record.get("attributes") or {}
        message_attributes = record.get("messageAttributes")
        body = record.get("body")
        return cls(
            message_id=message_id,
            body=body if isinstance(body, str) else "",
            group_id=str(attributes.get("MessageGroupId") or ""),
            receive_count=_int(attributes.get("ApproximateReceiveCount")) or 1,
            first_receive_ms=_int(attributes.get("ApproximateFirstReceiveTimestamp")),
            sequence_number=attributes.get("SequenceNumber"),
            source_arn=str(record.get("eventSourceARN") or ""),
            sender_id=attributes.get("SenderId") or None,
            # Lambda's records carry an empty object when the message has no attributes.
            original_sender_id=_string_attribute(message_attributes, ORIGINAL_SENDER_ID)
            if message_attributes
            else None,
        )

    @property
    def first_seen_at(self) -> str | None:
        """ApproximateFirstReceiveTimestamp as an RFC 3339 UTC string."""
        if self.first_receive_ms is None:
            return None
        moment = datetime.fromtimestamp(self.first_receive_ms / 1000, tz=UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class ValidReport(NamedTuple):
    """A record whose body is a valid ``ckpt.v1`` report."""

    message: SqsMessage
    report: CheckpointReport


class ValidRestart(NamedTuple):
    """A record whose body is a valid ``ckpt.restart.v1`` restart record."""

    message: SqsMessage
    record: RestartRecord


class Poison(NamedTuple):
    """A record that can never be written, and why."""

    message: SqsMessage
    error_class: str
    reason: str


def principal_of(sender_id: str) -> str:
    """The principal of a SenderId: an IAM user's id, or an assumed role's id without the session
    (every node of a job runs under the same role and its own session)."""
    return sender_id.partition(":")[0]


def sent_by(message: SqsMessage, replay_principal: str | None) -> SqsMessage | Poison:
    """``message`` with ``sender_id`` the sender it is judged by, or :class:`Poison`.

    A replay (``ckpt-pipeline replay-dlq``) re-sends under the operator's principal and carries
    the original SenderId in its envelope: that original is applied only when SQS says the replay
    principal the stack names sent it (anyone may set a message attribute; no one can set
    SenderId). A message carrying an original sender from any other principal is refused, and
    its DLQ copy names its real sender, so no replay can launder it.
    """
    sender = message.sender_id
    if not sender:
        return Poison(
            message,
            "MissingSender",
            "the SQS record has no attributes.SenderId: its sender cannot be checked",
        )
    original = message.original_sender_id
    if original is None:
        return message
    actual = principal_of(sender)
    if actual == principal_of(original):
        # Its own sender replaying it (or an emulator with one id for everyone): nothing to trust.
        return message._replace(original_sender_id=None)
    if replay_principal is not None and actual == replay_principal:
        return message._replace(sender_id=original, original_sender_id=None)
    return Poison(
        message._replace(original_sender_id=None),
        "ForeignSender",
        f"foreign sender: a replay naming {principal_of(original)} as its original sender was"
        f" sent by {actual}, which is not the replay principal"
        f" ({replay_principal or 'none configured: REPLAY_PRINCIPAL_ID'})",
    )


def within_prefixes(
    valid: ValidReport | ValidRestart, prefixes: Mapping[str, tuple[str, ...]]
) -> ValidReport | ValidRestart | Poison:
    """The stricter mode: ``valid`` (a report or a restart record) if its job id starts with a
    prefix its sender's principal may write, else :class:`Poison` (``ForeignSender``, as a
    report of another principal's job)."""
    principal = principal_of(valid.message.sender_id or "")
    allowed = prefixes.get(principal, ())
    job_id = valid.report.job_id if isinstance(valid, ValidReport) else valid.record.job_id
    if job_id.startswith(allowed):
        return valid
    return Poison(
        valid.message,
        "ForeignSender",
        f"foreign sender: job {job_id!r} is outside the prefixes {principal} may"
        f" write ({', '.join(allowed) or 'none'}); this report was sent by"
        f" {valid.message.sender_id}",
    )


def parse_event(event: Mapping[str, Any]) -> list[SqsMessage]:
    """The event's records in delivery order; raises :class:`MalformedEvent`."""
    records = event.get("Records")
    if not isinstance(records, Sequence) or isinstance(records, str | bytes):
        raise MalformedEvent("event has no Records list")
    return [SqsMessage.from_record(r) for r in records if isinstance(r, Mapping)]


def classify(message: SqsMessage) -> ValidReport | ValidRestart | Poison:
    """Decode and validate one message; every failure becomes :class:`Poison` with its reason."""
    try:
        if is_restart_body(message.body):
            from ckpt_contract.restart import decode_restart

            return ValidRestart(message, decode_restart(message.body))
        return ValidReport(message, decode(message.body))
    except MessageTooLarge as exc:
        return Poison(message, "MessageTooLarge", str(exc))
    except InvalidMessage as exc:
        return Poison(message, _invalid_class(exc), str(exc))


def expand(message: SqsMessage) -> list[ValidReport | ValidRestart | Poison]:
    """The reports of one message: itself classified, or each member of a ``ckpt.pack.v1`` pack
    classified on its own, as a message ``<messageId>#<index>`` whose body is that member alone
    (so that a bad member is parked in the DLQ by itself, and its replay is a plain report)."""
    try:
        members = split_pack(message.body)
    except InvalidMessage as exc:
        return [Poison(message, _invalid_class(exc), str(exc))]
    if members is None:
        return [classify(message)]
    return [
        classify(message._replace(message_id=f"{message.message_id}#{i}", body=body))
        for i, body in enumerate(members)
    ]


def poison_from(message: SqsMessage, error: PoisonRecord) -> Poison:
    """A :class:`Poison` for a record the database rejected permanently."""
    return Poison(message, error.error_class, str(error))


def _invalid_class(exc: InvalidMessage) -> str:
    # Distinguish "not JSON at all" and "another schema" from field-level validation failures,
    # so an operator sees at a glance which client produced it.
    if any(e.field == "schema" for e in exc.errors):
        return "UnknownSchema"
    if any(e.field == "<body>" for e in exc.errors):
        return "UndecodableBody"
    return "InvalidMessage"


def _string_attribute(message_attributes: Any, name: str) -> str | None:
    # Lambda's SQS event spells message attributes in camel case (stringValue, dataType).
    if not isinstance(message_attributes, Mapping):
        return None
    value = message_attributes.get(name)
    text = value.get("stringValue") if isinstance(value, Mapping) else None
    return text if isinstance(text, str) and text else None


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None
