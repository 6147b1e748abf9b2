"""``ckpt-pipeline status``: gather the per-job state and queue depths, render a table or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from ckpt_pipeline.ops.sqs import QueueDepth, queue_depth
from ckpt_pipeline.ops.status_queries import JobStatus, job_statuses
from ckpt_pipeline.sdk_errors import POSTGRESQL, SQS, calling, explain
from lambda_writer import connect_url


@dataclass(frozen=True)
class StatusReport:
    """Everything ``status`` shows."""

    jobs: list[JobStatus]
    queue_depth: QueueDepth | None = None
    dlq_depth: QueueDepth | None = None
    # One line per queue that could not be read (the table is still shown).
    queue_errors: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        def depth(d: QueueDepth | None) -> dict[str, int] | None:
            if d is None:
                return None
            return {
                "visible": d.visible,
                "in_flight": d.in_flight,
                "delayed": d.delayed,
                "total": d.total,
            }

        return {
            "jobs": [job.as_json() for job in self.jobs],
            "queue": depth(self.queue_depth),
            "dlq": depth(self.dlq_depth),
            "errors": self.queue_errors,
        }


def gather_status(
    database_url: str,
    *,
    sqs: Any = None,
    queue_url: str | None = None,
    dlq_url: str | None = None,
    job: str | None = None,
) -> StatusReport:
    """Query the database and, when URLs are given, the queues.

    A database error is raised (there is nothing to show without it); a queue that cannot be
    read becomes a line of ``queue_errors`` naming its URL, and the other parts are still shown.
    """
    with calling(POSTGRESQL, "DATABASE_URL"), connect_url(database_url) as conn:
        jobs = job_statuses(conn, job=job)
    errors: list[str] = []

    def depth(option: str, url: str | None) -> QueueDepth | None:
        if sqs is None or not url:
            return None
        try:
            return queue_depth(sqs, url)
        except Exception as exc:
            explained = explain(exc, service=SQS, setting=f"{option} {url}")
            if explained is None:
                raise
            errors.append(str(explained))
            return None

    return StatusReport(
        jobs=jobs,
        queue_depth=depth("--queue-url", queue_url),
        dlq_depth=depth("--dlq-url", dlq_url),
        queue_errors=errors,
    )


def duration(value: float | None) -> str:
    """A duration short enough for a narrow column: ``21 ms``, ``3.2 s``, ``12 min``, ``3.1 h``."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


# Short headers so that the table fits 80 columns; the caption says what they mean.
_COLUMNS = ("job", "complete", "latest", "attempt", "shards", "newest", "lag p50", "lag p99")
_CAPTION = (
    "complete: complete / all checkpoints · latest: latest complete step ·"
    " newest: since the newest report · lag: report to row written"
)


def render_table(report: StatusReport, console: Console, *, job: str | None = None) -> None:
    """A table of the jobs (readable at 80 columns), then the queue depths."""
    table = Table(
        title="Checkpoints per job",
        caption=_CAPTION,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
        title_justify="left",
        caption_justify="left",
    )
    for column in _COLUMNS:
        if column == "job":
            table.add_column(column, overflow="fold", min_width=8)
        else:
            table.add_column(column, justify="right", no_wrap=True)
    for row in report.jobs:
        table.add_row(
            row.job_id,
            f"{row.complete}/{row.checkpoints}",
            "-" if row.latest_complete_step is None else str(row.latest_complete_step),
            str(row.latest_run_attempt),
            str(row.shards),
            duration(row.since_newest_s),
            duration(row.lag_p50_s),
            duration(row.lag_p99_s),
        )
    if not report.jobs:
        console.print(
            "no checkpoints recorded yet"
            if job is None
            else f"no checkpoints recorded for job {job!r} (`ckpt-pipeline status`: all jobs)"
        )
    else:
        console.print(table)
    for name, depth in (("queue", report.queue_depth), ("DLQ", report.dlq_depth)):
        if depth is not None:
            console.print(
                f"{name}: {depth.visible} visible, {depth.in_flight} in flight,"
                f" {depth.delayed} delayed"
            )


def render_json(report: StatusReport) -> str:
    """The report as one JSON document."""
    return json.dumps(report.as_json(), indent=2, sort_keys=True)
