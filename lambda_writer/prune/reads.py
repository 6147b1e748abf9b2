"""Reads of one job's checkpoints (one query each): `checkpoints`, `prune`, the scheduled prune."""

from __future__ import annotations

from typing import Any

import psycopg

from lambda_writer.prune.policy import CheckpointRow

# Per checkpoint: its row, its shard rows and those of older attempts (superseded), and, with a
# metric, its value as ckpt_checkpoint_values (migration 0009) defines it.
_STATES = """
SELECT c.step, c.epoch, c.run_attempt, c.world_size, c.is_complete, p.shards_present,
       n.shard_rows, n.superseded_rows, {value}
FROM training_checkpoints c
JOIN training_checkpoint_progress p ON p.job_id = c.job_id AND p.step = c.step
CROSS JOIN LATERAL (
    SELECT count(*)::integer AS shard_rows,
           (count(*) FILTER (WHERE s.run_attempt < c.run_attempt))::integer AS superseded_rows
    FROM training_checkpoint_shards s
    WHERE s.job_id = c.job_id AND s.step = c.step
) n
{join}
WHERE c.job_id = %(job_id)s
ORDER BY c.step
"""
_WITH_VALUE = _STATES.format(
    value="v.value",
    join="LEFT JOIN ckpt_checkpoint_values(%(job_id)s, %(metric)s) v"
    " ON v.step = c.step AND v.run_attempt = c.run_attempt",
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
