"""Reads of one job's checkpoints (one query each): `checkpoints`, `prune`, the scheduled prune."""

from __future__ import annotations

from typing import Any

import psycopg

from lambda_writer.prune.records import CheckpointRow

# Per checkpoint: its row, its live shard count, whether it may have shard rows of older attempts
# (superseded), and, with a metric, its value as ckpt_checkpoint_values (migration 0012: kept by
# the writer) defines it. Flat in the job's shard rows: no shard row is read here.
_STATES = """
SELECT p.step, p.epoch, p.run_attempt, p.world_size, p.is_complete, p.shards_present,
       c.oldest_run_attempt < c.run_attempt, {value}
FROM training_checkpoint_progress p
JOIN training_checkpoints c ON c.job_id = p.job_id AND c.step = p.step
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

# The superseded shard rows of the checkpoints that may have some (a restart mid-save: the writer
# saw an older attempt, oldest_run_attempt < run_attempt), one primary-key range each. A statement
# of its own: counted in _STATES, the planner costs that count for every checkpoint (it cannot
# tell which have an older attempt), and above jit_above_cost JIT-compiles the statement for
# 0.4-1 s at 1,000 checkpoints (BENCHMARKS.md section 10).
_SUPERSEDED = """
SELECT f.step, count(s.rank)::integer
FROM unnest(%(steps)s::bigint[], %(attempts)s::integer[]) AS f(step, run_attempt)
LEFT JOIN training_checkpoint_shards s
  ON s.job_id = %(job_id)s AND s.step = f.step AND s.run_attempt < f.run_attempt
GROUP BY f.step
"""


def job_checkpoints(
    conn: psycopg.Connection[Any], job_id: str, *, metric: str | None
) -> list[CheckpointRow]:
    """Every checkpoint of ``job_id``, oldest first, with its value of ``metric`` if given.

    Its shard rows are its live count plus its superseded ones: a shard row's attempt is never
    above its checkpoint's (docs/DESIGN.md, Claim 1)."""
    query = _WITHOUT_VALUE if metric is None else _WITH_VALUE
    rows = conn.execute(query, {"job_id": job_id, "metric": metric}).fetchall()
    flagged = [(int(r[0]), int(r[2])) for r in rows if r[6]]
    superseded: dict[int, int] = {}
    if flagged:
        steps, attempts = zip(*flagged, strict=True)
        counted = conn.execute(
            _SUPERSEDED, {"job_id": job_id, "steps": list(steps), "attempts": list(attempts)}
        ).fetchall()
        superseded = {int(step): int(n) for step, n in counted}
    return [
        CheckpointRow(
            step=int(r[0]),
            epoch=int(r[1]),
            run_attempt=int(r[2]),
            world_size=int(r[3]),
            is_complete=bool(r[4]),
            shards_present=int(r[5]),
            shard_rows=int(r[5]) + superseded.get(int(r[0]), 0),
            superseded_rows=superseded.get(int(r[0]), 0),
            value=None if r[7] is None else float(r[7]),
        )
        for r in rows
    ]


def job_ids(conn: psycopg.Connection[Any]) -> list[str]:
    """Every job with a checkpoint row, sorted."""
    rows = conn.execute("SELECT DISTINCT job_id FROM training_checkpoints ORDER BY 1").fetchall()
    return [str(r[0]) for r in rows]
