"""What the demo verifies, read from the database (never from printed text)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from ckpt_pipeline.ops.status_queries import lag_percentiles

_CHECKPOINTS_SQL = """
SELECT c.step, c.epoch, c.run_attempt, c.world_size, c.shards_present, c.is_complete,
       count(s.rank) FILTER (WHERE s.run_attempt = c.run_attempt) AS shards_of_attempt,
       count(s.rank) AS shard_rows
FROM training_checkpoint_progress c
LEFT JOIN training_checkpoint_shards s ON s.job_id = c.job_id AND s.step = c.step
WHERE c.job_id = %s
GROUP BY c.step, c.epoch, c.run_attempt, c.world_size, c.shards_present, c.is_complete
ORDER BY c.step
"""
_LATEST_SQL = "SELECT step, epoch, run_attempt FROM latest_complete_checkpoints WHERE job_id = %s"


@dataclass(frozen=True)
class DemoCheckpointRow:
    """One row of ``training_checkpoints`` with its shard counts."""

    step: int
    epoch: int
    run_attempt: int
    world_size: int
    shards_present: int
    is_complete: bool
    shards_of_attempt: int
    shard_rows: int


@dataclass(frozen=True)
class JobVerification:
    """The seed's own verification of one job, as the database has it."""

    job_id: str
    checkpoints: tuple[DemoCheckpointRow, ...]
    latest_complete: tuple[int, int, int] | None
    lag_p50_s: float | None
    lag_p99_s: float | None

    @property
    def row_count(self) -> int:
        return len(self.checkpoints)

    @property
    def all_complete(self) -> bool:
        return all(c.is_complete for c in self.checkpoints)

    def problems(self, *, epochs: int, ranks: int) -> list[str]:
        """Everything that differs from "every epoch checkpointed once, by every rank"."""
        found = []
        if self.row_count != epochs:
            found.append(f"{self.row_count} rows in training_checkpoints, expected {epochs}")
        for c in self.checkpoints:
            if not c.is_complete or c.shards_of_attempt != ranks or c.shard_rows != ranks:
                found.append(
                    f"step {c.step}: {c.shards_of_attempt}/{ranks} shards of attempt"
                    f" {c.run_attempt} ({c.shard_rows} rows), complete={c.is_complete}"
                )
            if c.shards_present != c.shards_of_attempt:
                found.append(
                    f"step {c.step}: shards_present {c.shards_present} != {c.shards_of_attempt}"
                )
        return found


def verify_job(conn: psycopg.Connection[Any], job_id: str) -> JobVerification:
    """Read the job's checkpoints, shards, latest complete checkpoint and lag."""
    with conn.cursor(row_factory=class_row(DemoCheckpointRow)) as cur:
        rows = tuple(cur.execute(_CHECKPOINTS_SQL, (job_id,)).fetchall())
    latest = conn.execute(_LATEST_SQL, (job_id,)).fetchone()
    p50, p99 = lag_percentiles(conn, job=job_id)
    return JobVerification(
        job_id=job_id,
        checkpoints=rows,
        latest_complete=(int(latest[0]), int(latest[1]), int(latest[2])) if latest else None,
        lag_p50_s=p50,
        lag_p99_s=p99,
    )
