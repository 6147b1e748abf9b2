"""The ``ckpt.v1`` checkpoint report: typed model, identity (dedup / group ids), wire encoding."""

from __future__ import annotations

import codecs
import hashlib
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, Self, TypeGuard

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from ckpt_contract.exceptions import FieldError, InvalidMessage, MessageTooLarge
from ckpt_contract.objects import INT64_MAX, MAX_OBJECTS, StoredObject, objects_total_bytes

SCHEMA: Final = "ckpt.v1"
MAX_WORLD_SIZE = 1_000_000
MAX_URI_CHARS = 2048
MAX_METRICS = 256
MAX_METRIC_NAME_CHARS = 128
# SendMessageBatch takes at most 10 entries
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessageBatch.html):
# the client's send batches and the writer's DLQ batches are both cut at it.
MAX_SQS_BATCH_ENTRIES = 10
# Our own cap on one encoded report. SQS allows 1 MiB per message and per SendMessageBatch call
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html);
# 64 KiB keeps a full batch of 10 far below that, so batching never has to split on size.
MAX_BODY_BYTES = 64 * 1024
# SQS limits MessageGroupId and MessageDeduplicationId to 128 characters.
MAX_SQS_ID_CHARS = 128
JOB_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
# A launch's id (trainer_client/report/launch.py): the same on every rank of one launch, new at
# every launch; the writer refuses a report whose run_attempt another launch already claimed.
LAUNCH_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,64}$"
# Found at import, not at the first report: Python imports a codec's module on its first use,
# and that first use is a save's finish() on the training thread, where reading the module from
# a busy disk took 160 ms (BENCHMARKS.md §8).
_ESCAPE_KEY = codecs.getencoder("unicode_escape")
# Characters no hop can carry: PostgreSQL text and jsonb refuse NUL (CharacterNotInRepertoire /
# "unsupported Unicode escape sequence"), SQS refuses U+FFFE/U+FFFF and surrogates in a body
# (allowed: #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF,
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessage.html),
# and a lone surrogate is not UTF-8 at all. JSON escapes the other control characters.
# Compiled on the first non-ASCII text (_unstorable): ~0.6 ms off the writer's cold start.
_UNSTORABLE = "[\x00\ud800-\udfff\ufffe\uffff]"

JobId = Annotated[str, StringConstraints(pattern=JOB_ID_PATTERN)]
LaunchId = Annotated[str, StringConstraints(pattern=LAUNCH_ID_PATTERN)]
NonNegative = Annotated[int, Field(ge=0, le=INT64_MAX)]
# run_attempt is an ``integer`` column (int32) in both tables.
INT32_MAX = 2**31 - 1
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_METRIC_NAME_CHARS)]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
ObjectPins = Annotated[list[StoredObject], Field(min_length=1, max_length=MAX_OBJECTS)]


def is_metric_name(metric: object) -> TypeGuard[str]:
    """Whether ``metric`` can name a value: ``loss`` or a metrics key (:data:`MetricName`),
    printable: the one check behind every reader's ``metric`` option (best, prune)."""
    return (
        isinstance(metric, str)
        and 1 <= len(metric) <= MAX_METRIC_NAME_CHARS
        and not any(ord(ch) < 32 for ch in metric)
    )


# Which way a metric improves: "min" (a loss) or "max" (an accuracy). Every reader that ranks
# checkpoints by a metric takes it (best_complete_checkpoint, the retention policy's keep-best).
Mode = Literal["min", "max"]
MODES: tuple[Mode, ...] = ("min", "max")


class CheckpointReport(BaseModel):
    """One rank's report that its shard of checkpoint (job, run attempt, step) is durably written.

    Strict: no type coercion (``"5"`` is not a step, ``True`` is not a rank), no NaN/Infinity.
    Unknown extra fields are kept so that newer clients can roll forward before the writer does.
    """

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        extra="allow",
        allow_inf_nan=False,
        populate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    # Required on the wire: a body without "schema" is not a ckpt.v1 message.
    schema_version: Literal["ckpt.v1"] = Field(alias="schema")
    job_id: JobId
    run_attempt: Annotated[int, Field(ge=0, le=INT32_MAX)]
    step: NonNegative
    epoch: NonNegative
    world_size: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]
    rank: NonNegative
    uri: Annotated[str, StringConstraints(min_length=1, max_length=MAX_URI_CHARS)]
    loss: float | None = None
    metrics: Annotated[dict[MetricName, float], Field(max_length=MAX_METRICS)] = Field(
        default_factory=dict
    )
    bytes: NonNegative | None = None
    sha256: Sha256Hex | None = None
    # Optional pins of the objects the shard consists of (ckpt_contract/objects.py). Left out of
    # the body when absent, so a report without them is byte for byte what it always was; a
    # writer of the previous release keeps them as an unknown field (docs/DESIGN.md).
    objects: ObjectPins | None = None
    # The launch that wrote the shard (docs/DESIGN.md, "Launches"): optional and additive like
    # ``objects`` (left out of the body when absent; the previous writer keeps it in ``extra``,
    # where this writer stores it too, so the launch guard of migration 0014 reads one place).
    launch_id: LaunchId | None = None
    created_at: datetime

    @field_validator("rank")
    @classmethod
    def _rank_below_world_size(cls, rank: int, info: ValidationInfo) -> int:
        world_size = info.data.get("world_size")
        if world_size is not None and rank >= world_size:
            raise ValueError(f"must be < world_size ({world_size})")
        return rank

    @model_validator(mode="after")
    def _bytes_are_the_objects(self) -> Self:
        if self.objects is not None and self.bytes is not None:
            total = objects_total_bytes(self.objects)
            if total != self.bytes:
                raise ValueError(f"bytes ({self.bytes}) must be the objects' total ({total})")
        return self

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return as_utc(value)

    @field_serializer("created_at")
    def _rfc3339(self, value: datetime) -> str:
        return rfc3339(value)

    @classmethod
    def create(cls, **fields: Any) -> CheckpointReport:
        """Build and validate a report from Python values, raising :class:`InvalidMessage`."""
        fields.setdefault("schema", SCHEMA)
        try:
            report = cls.model_validate(fields)
        except ValidationError as exc:
            raise invalid(exc) from None
        return _storable(report)

    @property
    def extra(self) -> dict[str, Any]:
        """Fields this version of the contract does not know, kept as sent."""
        return dict(self.model_extra or {})

    @property
    def dedup_id(self) -> str:
        """The SQS MessageDeduplicationId of this report (its identity, not its content)."""
        return dedup_id(self.job_id, self.run_attempt, self.step, self.rank, self.launch_id)

    @property
    def group_id(self) -> str:
        """The SQS MessageGroupId of this report: order is kept per (job, rank)."""
        return group_id(self.job_id, self.rank)


def dedup_id(
    job_id: str, run_attempt: int, step: int, rank: int, launch_id: str | None = None
) -> str:
    """Hex SHA-256 of ``job_id|run_attempt|step|rank`` (``|launch_id`` when the report has one):
    the report's identity, not its content.

    A resend is the same message (SQS drops it within 5 minutes); a new attempt is a new one, and
    so is another launch's report of the same attempt: SQS must deliver it, so that the writer
    refuses it with its reason instead of SQS dropping it unseen.
    """
    identity = f"{job_id}|{run_attempt}|{step}|{rank}"
    if launch_id is not None:
        identity += f"|{launch_id}"
    return hashlib.sha256(identity.encode()).hexdigest()


def group_id(job_id: str, rank: int | str) -> str:
    """``job_id:rank``, shortened deterministically when it would exceed SQS's 128 characters.

    A 128-character job id plus ``:rank`` does not fit; such ids keep a prefix and gain a hash of
    the full job id, so distinct jobs never share a group. (``rank`` may be a name: the restart
    records' group is ``job_id:restart``.)
    """
    plain = f"{job_id}:{rank}"
    if len(plain) <= MAX_SQS_ID_CHARS:
        return plain
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:16]
    suffix = f"~{digest}:{rank}"
    return job_id[: MAX_SQS_ID_CHARS - len(suffix)] + suffix


def as_utc(value: datetime) -> datetime:
    """A timestamp with a timezone, in UTC (every message's ``created_at``)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must be an RFC 3339 timestamp with a timezone (UTC)")
    return value.astimezone(UTC)


def rfc3339(value: datetime) -> str:
    """A UTC timestamp (:func:`as_utc`) as RFC 3339 text ending in "Z"."""
    # isoformat's "+00:00" becomes "Z": the same text as strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    # ~40 us less per report after an idle pause.
    return value.isoformat(timespec="microseconds").removesuffix("+00:00") + "Z"


def encode(report: CheckpointReport) -> str:
    """The SQS message body of ``report``; raises :class:`MessageTooLarge` beyond MAX_BODY_BYTES."""
    body = report.model_dump_json(exclude=_absent(report))
    size = len(body.encode())
    if size > MAX_BODY_BYTES:
        raise MessageTooLarge(
            [FieldError("<body>", f"encoded size {size} B exceeds the limit of {MAX_BODY_BYTES} B")]
        )
    return body


_NO_OBJECTS: Final[set[str]] = {"objects"}
_NO_LAUNCH: Final[set[str]] = {"launch_id"}
_NEITHER: Final[set[str]] = {"objects", "launch_id"}


def _absent(report: CheckpointReport) -> set[str] | None:
    # Optional fields left out when absent, so a report without them is byte for byte what the
    # previous release sent (and what its writer expects).
    if report.objects is None:
        return _NEITHER if report.launch_id is None else _NO_OBJECTS
    return _NO_LAUNCH if report.launch_id is None else None


def decode(body: str | bytes) -> CheckpointReport:
    """Parse and validate one SQS message body; raises :class:`InvalidMessage` naming each field."""
    raw = body if isinstance(body, bytes) else body.encode("utf-8", errors="surrogatepass")
    if len(raw) > MAX_BODY_BYTES:
        raise MessageTooLarge(
            [FieldError("<body>", f"size {len(raw)} B exceeds the limit of {MAX_BODY_BYTES} B")]
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessage([FieldError("<body>", f"must be UTF-8 ({exc.reason})")]) from None
    try:
        report = CheckpointReport.model_validate_json(text)
    except ValidationError as exc:
        raise invalid(exc) from None
    return _storable(report)


def _problems(path: str, value: Any) -> Iterator[FieldError]:
    # Walks every value, extras included, since the writer stores the whole body as jsonb.
    if isinstance(value, str):
        bad = _unstorable(value)
        if bad is not None:
            yield FieldError(path, f"contains U+{ord(bad):04X}, which no hop can store")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, float):
        if not math.isfinite(value):
            yield FieldError(path, "must be a finite number")
    elif isinstance(value, int):
        return
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                yield FieldError(path or "<body>", "keys must be strings")
                continue
            # The path shows a bad key escaped, so the error message itself stays printable.
            name = _ESCAPE_KEY(key)[0].decode("ascii")
            here = f"{path}.{name}" if path else name
            yield from _problems(here, key)
            yield from _problems(here, item)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _problems(f"{path}.{i}", item)
    elif isinstance(value, datetime):
        return
    else:
        yield FieldError(
            path,
            f"must be JSON (string, number, bool, null, list, object), not {type(value).__name__}",
        )


def _storable(report: CheckpointReport) -> CheckpointReport:
    """``report`` if every hop (SQS body, PostgreSQL text/bigint/jsonb) can carry it."""
    if not report.model_extra and not _free_text_unstorable(report):
        # Everything else of a report without extras is already held by the model (strict,
        # bounded integers, finite floats, ASCII patterns): the walk below could find nothing.
        # It costs ~40 us on report()'s path, five times pydantic's own validation.
        return report
    values = {name: getattr(report, name) for name in type(report).model_fields}
    if report.objects is not None:
        values["objects"] = [o.model_dump() for o in report.objects]
    values.update(report.model_extra or {})
    errors = list(_problems("", values))
    if errors:
        raise InvalidMessage(errors)
    return report


def _free_text_unstorable(report: CheckpointReport) -> bool:
    """True if a declared field the model leaves free (``uri``, metric names) has a character
    no hop can store: the only declared values the model itself does not rule out (its other
    strings are ASCII patterns or a literal, its floats finite, its integers bounded)."""
    if _unstorable(report.uri) is not None or _unstorable("".join(report.metrics)) is not None:
        return True
    return report.objects is not None and any(_unstorable(o.uri) for o in report.objects)


def _unstorable(text: str) -> str | None:
    """The first character of ``text`` that no hop can store, or None."""
    if text.isascii():
        # Of the ASCII characters only NUL is unstorable; most texts never need the pattern.
        return "\x00" if "\x00" in text else None
    bad = re.search(_UNSTORABLE, text)
    return None if bad is None else bad.group()


def invalid(exc: ValidationError, *, schema: str = SCHEMA) -> InvalidMessage:
    """pydantic's errors as :class:`InvalidMessage`, one field and rule each."""
    errors = []
    for err in exc.errors(include_url=False):
        field = ".".join(str(part) for part in err["loc"]) or "<body>"
        rule = err["msg"].removeprefix("Value error, ")
        errors.append(FieldError(field, rule))
    return InvalidMessage(errors, schema=schema)
