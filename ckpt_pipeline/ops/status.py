"""``ckpt-pipeline status``: gather the per-job state and queue depths, render a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rich import box
from rich.console import Console
from rich.table import Table

from ckpt_pipeline.exit_codes import EXIT_FAILED
from ckpt_pipeline.ops.sqs import QueueDepth, queue_depth
from ckpt_pipeline.ops.status_queries import JobStatus, job_statuses
from ckpt_pipeline.sdk_errors import (
    POSTGRESQL,
    SQS,
    ServiceError,
    calling,
    explain,
)
from lambda_writer import connect_url

_T = TypeVar("_T")


# The mapping's states (Lambda's EventSourceMapping State) as the breaker reads them: disabled
# means the breaker is open (or someone paused the writer), and reports wait in the queue.
_OPEN_STATES = frozenset({"Disabled", "Disabling"})
_CLOSED_STATES = frozenset({"Enabled", "Enabling"})


@dataclass(frozen=True)
class StatusReport:
    """Everything ``status`` shows; ``jobs`` is None when the database could not be read."""

    jobs: list[JobStatus] | None
    queue_depth: QueueDepth | None = None
    dlq_depth: QueueDepth | None = None
    # The writer's event source mapping's State (the circuit breaker's switch), when asked.
    mapping_state: str | None = None
    # One line per part that could not be read (the rest is still shown).
    queue_errors: list[str] = field(default_factory=list)
    database_error: str | None = None

    @property
    def errors(self) -> list[str]:
        """Every part that could not be read, one line each: the database first."""
        return [e for e in (self.database_error, *self.queue_errors) if e]

    @property
    def breaker(self) -> str | None:
        """The breaker's state in words, from the mapping's, or None when not asked."""
        if self.mapping_state is None:
            return None
        if self.mapping_state in _OPEN_STATES:
            return f"open: the writer's mapping is {self.mapping_state}, reports wait in the queue"
        if self.mapping_state in _CLOSED_STATES:
            return f"closed: the writer's mapping is {self.mapping_state}"
        return f"the writer's mapping is {self.mapping_state} (changing; look again in a minute)"

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
            "jobs": None if self.jobs is None else [job.as_json() for job in self.jobs],
            "queue": depth(self.queue_depth),
            "dlq": depth(self.dlq_depth),
            "mapping_state": self.mapping_state,
            "breaker": self.breaker,
            "errors": self.errors,
        }


def gather_status(
    database_url: str,
    *,
    sqs: Any = None,
    queue_url: str | None = None,
    dlq_url: str | None = None,
    job: str | None = None,
    lambda_client: Any = None,
    mapping_uuid: str | None = None,
) -> StatusReport:
    """Query the database and, when given, the queues and the writer's mapping.

    A part that cannot be read becomes a line of the report naming its setting, and the other
    parts are still shown: above all the queue and DLQ depths while the database is down. A
    database error is raised only when nothing else was asked for (there is nothing to show), or
    when it is a refused setting rather than a failure."""
    jobs: list[JobStatus] | None = None
    database_error: str | None = None
    try:
        with calling(POSTGRESQL, "DATABASE_URL"), connect_url(database_url) as conn:
            jobs = job_statuses(conn, job=job)
    except ServiceError as exc:
        if exc.exit_code != EXIT_FAILED or not (queue_url or dlq_url or mapping_uuid):
            raise
        database_error = str(exc)
    errors: list[str] = []

    def read(service: str, setting: str, call: Callable[[], _T]) -> _T | None:
        try:
            return call()
        except Exception as exc:
            explained = explain(exc, service=service, setting=setting)
            if explained is None:
                raise
            errors.append(str(explained))
            return None

    def depth(option: str, url: str | None) -> QueueDepth | None:
        if sqs is None or not url:
            return None
        return read(SQS, f"{option} {url}", lambda: queue_depth(sqs, url))

    state = None
    if lambda_client is not None and mapping_uuid:
        state = read(
            "Lambda",
            f"--mapping-uuid {mapping_uuid}",
            lambda: str(lambda_client.get_event_source_mapping(UUID=mapping_uuid)["State"]),
        )
    return StatusReport(
        jobs=jobs,
        queue_depth=depth("--queue-url", queue_url),
        dlq_depth=depth("--dlq-url", dlq_url),
        mapping_state=state,
        queue_errors=errors,
        database_error=database_error,
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
    for row in report.jobs or []:
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
    if report.jobs is None:
        console.print("checkpoints per job: not shown, the database cannot be read (stderr)")
    elif not report.jobs:
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
    if report.breaker is not None:
        console.print(f"breaker: {report.breaker}")


def render_json(report: StatusReport) -> str:
    """The report as one JSON document."""
    return json.dumps(report.as_json(), indent=2, sort_keys=True)
