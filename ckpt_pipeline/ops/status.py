"""``ckpt-pipeline status``: gather the per-job state and queue depths, render a table or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from ckpt_pipeline.ops.sqs import QueueDepth, queue_depth
from ckpt_pipeline.ops.status_queries import JobStatus, job_statuses
from lambda_writer.connection import connect_url


@dataclass(frozen=True)
class StatusReport:
    """Everything ``status`` shows."""

    jobs: list[JobStatus]
    queue_depth: QueueDepth | None = None
    dlq_depth: QueueDepth | None = None

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
        }


def gather_status(
    database_url: str,
    *,
    sqs: Any = None,
    queue_url: str | None = None,
    dlq_url: str | None = None,
    job: str | None = None,
) -> StatusReport:
    """Query the database and, when URLs are given, the queues."""
    with connect_url(database_url) as conn:
        jobs = job_statuses(conn, job=job)
    return StatusReport(
        jobs=jobs,
        queue_depth=queue_depth(sqs, queue_url) if sqs is not None and queue_url else None,
        dlq_depth=queue_depth(sqs, dlq_url) if sqs is not None and dlq_url else None,
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def render_table(report: StatusReport, console: Console) -> None:
    """A table per job, then the queue depths."""
    table = Table(title="Checkpoints per job")
    for column in ("job", "checkpoints", "complete", "incomplete", "latest complete step"):
        table.add_column(column, justify="left" if column == "job" else "right")
    for column in ("attempt", "shards", "since newest report", "lag p50", "lag p99"):
        table.add_column(column, justify="right")
    for job in report.jobs:
        table.add_row(
            job.job_id,
            str(job.checkpoints),
            str(job.complete),
            str(job.incomplete),
            "-" if job.latest_complete_step is None else str(job.latest_complete_step),
            str(job.latest_run_attempt),
            str(job.shards),
            _seconds(job.since_newest_s),
            _seconds(job.lag_p50_s),
            _seconds(job.lag_p99_s),
        )
    if not report.jobs:
        console.print("no checkpoints recorded yet")
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
