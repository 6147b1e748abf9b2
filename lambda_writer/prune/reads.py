"""Reads of one job's checkpoints (one query each): `checkpoints`, `prune`, the scheduled prune."""

from __future__ import annotations

from typing import Any

import psycopg

from lambda_writer.prune.policy import CheckpointRow

# Per checkpoint: its row, its shard rows and those of older attempts (superseded), and, with a
# metric, its value as ckpt_checkpoint_values (migration 0012: kept by the writer) defines it.
# Flat in the job's shard rows: a shard row's attempt is never above its checkpoint's (docs/
# DESIGN.md, Claim 1), so its rows are the live count of its attempt (the progress view) plus
# the superseded ones, and those are counted (one range of the primary key) only where the
# writer saw an older attempt (oldest_run_attempt, migration 0012): a restart mid-save.
_STATES = """
SELECT p.step, p.epoch, p.run_attempt, p.world_size, p.is_complete, p.shards_present,
       p.shards_present + n.superseded_rows, n.superseded_rows, {value}
FROM training_checkpoint_progress p
JOIN training_checkpoints c ON c.job_id = p.job_id AND c.step = p.step
CROSS JOIN LATERAL (
    SELECT count(*)::integer AS superseded_rows
    FROM training_checkpoint_shards s
    WHERE c.oldest_run_attempt < c.run_attempt
      AND s.job_id = c.job_id AND s.step = c.step AND s.run_attempt < c.run_attempt
) n
{join}
WHERE p.job_id = %(job_id)s
ORDER BY p.step
"""
_WITH_VALUE = _STATES.format(
    value="v.value",
    join="LEFT JOIN ckpt_checkpoint_values(%(job_id)s, %(metric)s) v"
    " ON v.step = p.step AND v.run_attempt = p.run_attempt",
)
_WITHOUT_VALUE = _STATES.format(value="NULL::double precision", join="")


def job_checkpoints(
    conn: psycopg.Connection[Any], job_id: str, *, metric: str | None
) -> list[CheckpointRow]:
    """Every checkpoint of ``job_id``, oldest first, with its value of ``metric`` if given."""
    query = _WITHOUT_VALUE if metric is None else _WITH_VALUE
    rows = conn.execute(query, {"job_id": job_id, "metric": metric}).fetchall()
    return [
        CheckpointRow(
            step=int(r[0]),
            epoch=int(r[1]),
            run_attempt=int(r[2]),
            world_size=int(r[3]),
            is_complete=bool(r[4]),
            shards_present=int(r[5]),
            shard_rows=int(r[6]),
            superseded_rows=int(r[7]),
            value=None if r[8] is None else float(r[8]),
        )
        for r in rows
    ]


def job_ids(conn: psycopg.Connection[Any]) -> list[str]:
    """Every job with a checkpoint row, sorted."""
    rows = conn.execute("SELECT DISTINCT job_id FROM training_checkpoints ORDER BY 1").fetchall()
    return [str(r[0]) for r in rows]
