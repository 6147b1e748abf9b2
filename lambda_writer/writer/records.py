"""SQS event records as typed values, and their classification into reports or poison (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from ckpt_contract import CheckpointReport, InvalidMessage, MessageTooLarge, decode
from ckpt_contract.pack import split_pack
from lambda_writer.writer.exceptions import MalformedEvent, PoisonRecord

if TYPE_CHECKING:
    # Imported when a restart record is first seen (classify): a batch of reports never needs
    # its model, and the handler's cold start does not pay for it.
    from ckpt_contract.restart import RestartRecord

# A restart record is told from a report by its schema near the start (ckpt_contract/restart.py).
_RESTART_SCHEMA = "ckpt.restart.v1"


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

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SqsMessage:
        """Read one event record; raises :class:`MalformedEvent` if it is not SQS's shape."""
        message_id = record.get("messageId")
        if not isinstance(message_id, str) or not message_id:
            raise MalformedEvent("SQS record without a messageId")
        attributes = record.get("attributes") or {}
        body = record.get("body")
        return cls(
            message_id=message_id,
            body=body if isinstance(body, str) else "",
            group_id=str(attributes.get("MessageGroupId") or ""),
            receive_count=_int(attributes.get("ApproximateReceiveCount")) or 1,
            first_receive_ms=_int(attributes.get("ApproximateFirstReceiveTimestamp")),
            sequence_number=attributes.get("SequenceNumber"),
            source_arn=str(record.get("eventSourceARN") or ""),
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


def parse_event(event: Mapping[str, Any]) -> list[SqsMessage]:
    """The event's records in delivery order; raises :class:`MalformedEvent`."""
    records = event.get("Records")
    if not isinstance(records, Sequence) or isinstance(records, str | bytes):
        raise MalformedEvent("event has no Records list")
    return [SqsMessage.from_record(r) for r in records if isinstance(r, Mapping)]


def classify(message: SqsMessage) -> ValidReport | ValidRestart | Poison:
    """Decode and validate one message; every failure becomes :class:`Poison` with its reason."""
    try:
        if _RESTART_SCHEMA in message.body[:64]:
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


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None
