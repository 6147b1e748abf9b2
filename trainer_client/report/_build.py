"""One report from ``report()``'s keyword fields and the reporter's configuration (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ckpt_contract import CheckpointReport, FieldError, InvalidMessage, encode
from trainer_client.config import ReporterConfig
from trainer_client.report._fields import (
    REPORT_FIELDS,
    check_arguments,
    integer,
    number,
    objects_field,
)

# Set from the configuration, never by a caller (nor through ``extra``).
_CONFIGURED_FIELDS = frozenset(
    {
        "schema",
        "schema_version",
        "job_id",
        "run_attempt",
        "launch_id",
        "rank",
        "world_size",
        "created_at",
    }
)


def build_report(
    cfg: ReporterConfig,
    fields: Mapping[str, Any],
    run_attempt: int | None = None,
    world_size: int | None = None,
) -> tuple[CheckpointReport, str]:
    """The validated report and its encoded body (encoded once: report() spools that)."""
    check_arguments(fields)
    extra = fields.get("extra") or {}
    if not isinstance(extra, Mapping):
        raise InvalidMessage([FieldError("extra", "must be a mapping of field name to value")])
    reserved = sorted((_CONFIGURED_FIELDS | REPORT_FIELDS).intersection(extra))
    if reserved:
        raise InvalidMessage(
            [FieldError(name, "is not an extra field (set it directly)") for name in reserved]
        )
    metrics = fields.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise InvalidMessage([FieldError("metrics", "must be a mapping of metric name to number")])
    report = CheckpointReport.create(
        **{str(k): v for k, v in extra.items()},
        job_id=cfg.job_id,
        run_attempt=cfg.run_attempt if run_attempt is None else run_attempt,
        launch_id=cfg.launch_id,
        rank=cfg.rank,
        world_size=cfg.world_size if world_size is None else world_size,
        step=integer(fields["step"]),
        epoch=integer(fields["epoch"]),
        uri=fields["uri"],
        loss=number(fields.get("loss")),
        metrics={k: number(v) for k, v in metrics.items()},
        bytes=integer(fields.get("bytes")),
        sha256=fields.get("sha256"),
        **objects_field(fields.get("objects")),
        created_at=datetime.now(UTC),
    )
    return report, encode(report)  # raises MessageTooLarge / InvalidMessage at the call
