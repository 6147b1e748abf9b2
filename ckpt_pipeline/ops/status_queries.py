"""The SQL behind ``ckpt-pipeline status``: one row per job, computed by PostgreSQL."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg

# "Complete" and "latest complete" are the views' (migration 0010: defined once, for every reader).
# Lag of a shard = updated_at - reported_at (client report to row written, through SQS and the
# writer); "since newest" = now - the newest shard's reported_at (how stale the job's reporting is).
JOB_STATUS_SQL = """
WITH checkpoints AS (
    SELECT job_id, count(*) AS checkpoints, max(run_attempt) AS latest_run_attempt
    FROM training_checkpoints
    WHERE %(job)s::text IS NULL OR job_id = %(job)s::text
    GROUP BY job_id
), complete AS (
    SELECT job_id, count(*) AS complete
    FROM complete_checkpoints
    WHERE %(job)s::text IS NULL OR job_id = %(job)s::text
    GROUP BY job_id
), latest AS (
    SELECT job_id, step
    FROM latest_complete_checkpoints
    WHERE %(job)s::text IS NULL OR job_id = %(job)s::text
), shards AS (
    SELECT job_id,
           count(*)                                                        AS shards,
           max(reported_at)                                                AS newest_reported_at,
           extract(epoch FROM now() - max(reported_at))::float8            AS since_newest_s,
           percentile_cont(0.5) WITHIN GROUP (
               ORDER BY extract(epoch FROM updated_at - reported_at))::float8 AS lag_p50_s,
           percentile_cont(0.99) WITHIN GROUP (
               ORDER BY extract(epoch FROM updated_at - reported_at))::float8 AS lag_p99_s
    FROM training_checkpoint_shards
    WHERE %(job)s::text IS NULL OR job_id = %(job)s::text
    GROUP BY job_id
)
SELECT c.job_id, c.checkpoints, coalesce(k.complete, 0),
       c.checkpoints - coalesce(k.complete, 0), l.step,
       c.latest_run_attempt, coalesce(s.shards, 0), s.newest_reported_at, s.since_newest_s,
       s.lag_p50_s, s.lag_p99_s
FROM checkpoints c
LEFT JOIN complete k USING (job_id)
LEFT JOIN latest l USING (job_id)
LEFT JOIN shards s USING (job_id)
ORDER BY c.job_id
"""


@dataclass(frozen=True)
class JobStatus:
    """One job's checkpoint state and write lag."""

    job_id: str
    checkpoints: int
    complete: int
    incomplete: int
    latest_complete_step: int | None
    latest_run_attempt: int
    shards: int
    newest_reported_at: datetime | None
    since_newest_s: float | None
    lag_p50_s: float | None
    lag_p99_s: float | None

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.newest_reported_at is not None:
            data["newest_reported_at"] = self.newest_reported_at.isoformat()
        return data


def job_statuses(conn: psycopg.Connection[Any], *, job: str | None = None) -> list[JobStatus]:
    """Every job's status (or one job's), ordered by job id."""
    rows = conn.execute(JOB_STATUS_SQL, {"job": job}).fetchall()
    return [
        JobStatus(
            job_id=row[0],
            checkpoints=int(row[1]),
            complete=int(row[2]),
            incomplete=int(row[3]),
            latest_complete_step=None if row[4] is None else int(row[4]),
            latest_run_attempt=int(row[5]),
            shards=int(row[6]),
            newest_reported_at=row[7],
            since_newest_s=row[8],
            lag_p50_s=row[9],
            lag_p99_s=row[10],
        )
        for row in rows
    ]


def latest_complete_step(conn: psycopg.Connection[Any], job_id: str) -> int | None:
    """The newest complete checkpoint's step of ``job_id`` (what a resuming job reads)."""
    row = conn.execute(
        "SELECT step FROM latest_complete_checkpoints WHERE job_id = %s", (job_id,)
    ).fetchone()
    return None if row is None else int(row[0])


def lag_percentiles(
    conn: psycopg.Connection[Any], *, job: str | None = None
) -> tuple[float | None, float | None]:
    """End-to-end lag p50 and p99 in seconds: current row written minus its report created."""
    row = conn.execute(
        """
        SELECT percentile_cont(0.5) WITHIN GROUP (
                   ORDER BY extract(epoch FROM updated_at - reported_at))::float8,
               percentile_cont(0.99) WITHIN GROUP (
                   ORDER BY extract(epoch FROM updated_at - reported_at))::float8
        FROM training_checkpoint_shards
        WHERE %(job)s::text IS NULL OR job_id = %(job)s::text
        """,
        {"job": job},
    ).fetchone()
    return (None, None) if row is None else (row[0], row[1])


def connections_now(conn: psycopg.Connection[Any], *, database: str | None = None) -> int:
    """Client backends on ``database`` (default: the current one) now, from pg_stat_activity."""
    row = conn.execute(
        """
        SELECT count(*) FROM pg_stat_activity
        WHERE backend_type = 'client backend' AND datname = coalesce(%s, current_database())
          AND pid <> pg_backend_pid()
        """,
        (database,),
    ).fetchone()
    return 0 if row is None else int(row[0])
