"""The ``ckpt.restart.v1`` restart record: what one restart of a job decided, why, and what it
cost, sent by rank 0 through the queue like every report (a rank never writes the database).

One record per launch that made the restart call: the checkpoint it resumed from (or none), every
newer candidate it passed over and why, what the wait waited for and whether the deadline cut it,
seconds to the decision and to restored, the bytes the nodes fetched (summed and maxed across
ranks, fixed-size whatever the number of nodes), and the newest step any rank or the store had
saved, so that steps lost = that step - the one resumed from (docs/DESIGN.md, "Restart records").
Strict like ``ckpt.v1``: unknown fields refused (the writer stores named columns only).
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_serializer,
    field_validator,
)

from ckpt_contract.exceptions import FieldError, InvalidMessage, MessageTooLarge
from ckpt_contract.kinds import RESTART_SCHEMA
from ckpt_contract.message import (
    INT32_MAX,
    MAX_BODY_BYTES,
    MAX_WORLD_SIZE,
    JobId,
    LaunchId,
    as_utc,
    group_id,
    invalid,
    rfc3339,
)
from ckpt_contract.objects import INT64_MAX

# Candidates a record names (newest first): a restart that skipped more says how many in total.
MAX_SKIPPED = 16
MAX_REASON_CHARS = 512
MAX_MISSING_RANKS = 16
# Where a restart found the checkpoint's files, as ``Resumed.source`` says.
SOURCES = ("file", "manifest", "local", "store")

Attempt = Annotated[int, Field(ge=0, le=INT32_MAX)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Seconds = Annotated[float, Field(ge=0, le=10**7)]
Reason = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON_CHARS)]


class SkippedCandidate(BaseModel):
    """A checkpoint newer than the one resumed from, and why it was passed over."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    step: Count
    kind: Literal["damaged", "diverged", "incomplete"]
    reason: Reason
    missing_ranks: Annotated[list[Count], Field(max_length=MAX_MISSING_RANKS)] | None = None


class RestartRecord(BaseModel):
    """One restart of a job (see the module docstring)."""

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        extra="forbid",
        allow_inf_nan=False,
        populate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    schema_version: Literal["ckpt.restart.v1"] = Field(alias="schema")
    job_id: JobId
    # The launch the restart began (trainer_client/report/launch.py).
    run_attempt: Attempt
    launch_id: LaunchId | None = None
    world_size: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]
    resumed_step: Count | None = None
    resumed_run_attempt: Attempt | None = None
    resumed_world_size: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)] | None = None
    skipped: Annotated[list[SkippedCandidate], Field(max_length=MAX_SKIPPED)] = Field(
        default_factory=list
    )
    skipped_total: Count = 0
    # Reports of earlier launches the restart waited for (SQS accepted them at its flush), those
    # the database did not hold at the deadline, and those still unsent.
    waited_reports: Count = 0
    unwritten_reports: Count = 0
    unsent_reports: Count = 0
    deadline_cut: bool = False
    decided_s: Seconds
    restored_s: Seconds | None = None
    # Summed and maxed over the ranks that fetched (one per node), and how many nodes did.
    fetched_bytes: Count = 0
    max_node_fetched_bytes: Count = 0
    nodes_fetched: Count = 0
    source: Literal["file", "manifest", "local", "store"] | None = None
    # The newest step any rank's spool or the store had saved (None: none known).
    newest_saved_step: Count | None = None
    # Restarts before this one that resumed from the same step in a row, and how many in a row
    # the restart calls a loop (the writer's RestartLoops metric, the stack's alarm).
    loop_restarts: Count = 0
    loop_after: Annotated[int, Field(ge=2, le=1000)] = 3
    created_at: datetime

    @field_validator("decided_s", "restored_s")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return as_utc(value)

    @field_serializer("created_at")
    def _rfc3339(self, value: datetime) -> str:
        return rfc3339(value)

    @property
    def steps_lost(self) -> int | None:
        """Steps saved and not resumed from: newest saved - resumed (from scratch: newest)."""
        if self.newest_saved_step is None:
            return None
        return max(0, self.newest_saved_step - (self.resumed_step or 0))

    @property
    def in_loop(self) -> bool:
        """This restart is the ``loop_after``-th or later in a row from one checkpoint."""
        return self.resumed_step is not None and self.loop_restarts + 1 >= self.loop_after

    @property
    def dedup_id(self) -> str:
        """One record per launch: a re-send is the same message."""
        identity = f"restart|{self.job_id}|{self.run_attempt}|{self.launch_id or ''}"
        return hashlib.sha256(identity.encode()).hexdigest()

    @property
    def group_id(self) -> str:
        """The job's restart group, apart from its ranks' report groups."""
        return restart_group_id(self.job_id)


def restart_group_id(job_id: str) -> str:
    """``job_id:restart``: the job's restart records in a group of their own (shortened as a
    report's group is, beyond SQS's 128 characters)."""
    return group_id(job_id, "restart")


def encode_restart(record: RestartRecord) -> str:
    """The SQS message body of ``record``; raises :class:`MessageTooLarge` beyond the cap."""
    body = record.model_dump_json()
    if len(body.encode()) > MAX_BODY_BYTES:
        raise MessageTooLarge(
            [FieldError("<body>", f"exceeds {MAX_BODY_BYTES} B")], schema=RESTART_SCHEMA
        )
    return body


def decode_restart(body: str) -> RestartRecord:
    """Parse and validate one restart record; raises :class:`InvalidMessage` naming each field."""
    if len(body.encode("utf-8", errors="surrogatepass")) > MAX_BODY_BYTES:
        raise MessageTooLarge(
            [FieldError("<body>", f"exceeds {MAX_BODY_BYTES} B")], schema=RESTART_SCHEMA
        )
    try:
        json.loads(body)
    except ValueError:
        raise InvalidMessage(
            [FieldError("<body>", "not valid JSON")], schema=RESTART_SCHEMA
        ) from None
    try:
        return RestartRecord.model_validate_json(body)
    except ValidationError as exc:
        raise invalid(exc, schema=RESTART_SCHEMA) from None
