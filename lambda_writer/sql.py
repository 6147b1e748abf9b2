"""The writer's three statements and their parameters (pure: no connection needed).

Each statement takes the whole batch as arrays and ``unnest``s them, so a batch of any size is
three statements, parameterised only. Array order is the plan's key order, which is the order
rows are locked in.
"""

from __future__ import annotations

from typing import Any

from lambda_writer.planning import BatchPlan

# 1. One row per checkpoint. ON CONFLICT locks the existing row even when the WHERE is false
#    (https://www.postgresql.org/docs/current/sql-insert.html#SQL-ON-CONFLICT), so every writer
#    touching a checkpoint queues here, in key order. The SET is the same join as
#    CheckpointRow.merge: a newer attempt replaces the row and restarts its count; the same attempt
#    only raises world_size/epoch; first_reported_at only moves earlier.
UPSERT_CHECKPOINTS = """
INSERT INTO training_checkpoints AS c
    (job_id, step, run_attempt, epoch, world_size, first_reported_at)
SELECT * FROM unnest(
    %(job_id)s::text[], %(step)s::bigint[], %(run_attempt)s::integer[], %(epoch)s::bigint[],
    %(world_size)s::integer[], %(first_reported_at)s::timestamptz[])
ON CONFLICT (job_id, step) DO UPDATE SET
    run_attempt = GREATEST(c.run_attempt, EXCLUDED.run_attempt),
    epoch = CASE
        WHEN EXCLUDED.run_attempt > c.run_attempt THEN EXCLUDED.epoch
        WHEN EXCLUDED.run_attempt = c.run_attempt THEN GREATEST(c.epoch, EXCLUDED.epoch)
        ELSE c.epoch END,
    world_size = CASE
        WHEN EXCLUDED.run_attempt > c.run_attempt THEN EXCLUDED.world_size
        WHEN EXCLUDED.run_attempt = c.run_attempt THEN GREATEST(c.world_size, EXCLUDED.world_size)
        ELSE c.world_size END,
    shards_present = CASE WHEN EXCLUDED.run_attempt > c.run_attempt THEN 0
        ELSE c.shards_present END,
    is_complete = CASE WHEN EXCLUDED.run_attempt > c.run_attempt THEN false
        ELSE c.is_complete END,
    completed_at = CASE WHEN EXCLUDED.run_attempt > c.run_attempt THEN NULL
        ELSE c.completed_at END,
    first_reported_at = LEAST(c.first_reported_at, EXCLUDED.first_reported_at),
    updated_at = now()
WHERE EXCLUDED.run_attempt > c.run_attempt
   OR (EXCLUDED.run_attempt = c.run_attempt
       AND (EXCLUDED.world_size > c.world_size OR EXCLUDED.epoch > c.epoch))
   OR EXCLUDED.first_reported_at < c.first_reported_at
"""

# 2. One row per shard: only a strictly newer attempt replaces a stored shard; the same attempt
#    again is a no-op replay (rowcount counts inserted + updated rows only).
UPSERT_SHARDS = """
INSERT INTO training_checkpoint_shards AS s
    (job_id, step, rank, run_attempt, epoch, world_size, uri, loss, metrics, size_bytes, sha256,
     extra, sqs_message_id, reported_at)
SELECT * FROM unnest(
    %(job_id)s::text[], %(step)s::bigint[], %(rank)s::integer[], %(run_attempt)s::integer[],
    %(epoch)s::bigint[], %(world_size)s::integer[], %(uri)s::text[],
    %(loss)s::double precision[], %(metrics)s::text[]::jsonb[], %(size_bytes)s::bigint[],
    %(sha256)s::text[], %(extra)s::text[]::jsonb[], %(sqs_message_id)s::text[],
    %(reported_at)s::timestamptz[])
ON CONFLICT (job_id, step, rank) DO UPDATE SET
    run_attempt = EXCLUDED.run_attempt,
    epoch = EXCLUDED.epoch,
    world_size = EXCLUDED.world_size,
    uri = EXCLUDED.uri,
    loss = EXCLUDED.loss,
    metrics = EXCLUDED.metrics,
    size_bytes = EXCLUDED.size_bytes,
    sha256 = EXCLUDED.sha256,
    extra = EXCLUDED.extra,
    sqs_message_id = EXCLUDED.sqs_message_id,
    reported_at = EXCLUDED.reported_at,
    updated_at = now()
WHERE EXCLUDED.run_attempt > s.run_attempt
"""

# 3. Recount the touched checkpoints from the shards of their current attempt. This statement's
#    snapshot is taken after step 1 got the row locks, so every earlier writer of these
#    checkpoints has committed and is counted; later ones wait for us. Rows whose count did not
#    change are left alone (a replay writes nothing here).
RECOUNT_CHECKPOINTS = """
WITH touched AS (
    SELECT * FROM unnest(%(job_id)s::text[], %(step)s::bigint[]) AS t(job_id, step)
), counts AS (
    SELECT c.job_id, c.step, count(s.rank)::integer AS present
    FROM touched t
    JOIN training_checkpoints c ON c.job_id = t.job_id AND c.step = t.step
    LEFT JOIN training_checkpoint_shards s
        ON s.job_id = c.job_id AND s.step = c.step AND s.run_attempt = c.run_attempt
    GROUP BY c.job_id, c.step
)
UPDATE training_checkpoints c SET
    shards_present = n.present,
    is_complete = (n.present >= c.world_size),
    completed_at = CASE WHEN n.present >= c.world_size THEN COALESCE(c.completed_at, now()) END,
    updated_at = now()
FROM counts n
WHERE c.job_id = n.job_id AND c.step = n.step
  AND (c.shards_present <> n.present OR c.is_complete <> (n.present >= c.world_size))
"""


def checkpoint_params(plan: BatchPlan) -> dict[str, list[Any]]:
    """Column arrays for :data:`UPSERT_CHECKPOINTS`, in key order."""
    rows = plan.checkpoints
    return {
        "job_id": [r.job_id for r in rows],
        "step": [r.step for r in rows],
        "run_attempt": [r.run_attempt for r in rows],
        "epoch": [r.epoch for r in rows],
        "world_size": [r.world_size for r in rows],
        "first_reported_at": [r.first_reported_at for r in rows],
    }


def shard_params(plan: BatchPlan) -> dict[str, list[Any]]:
    """Column arrays for :data:`UPSERT_SHARDS`, in key order."""
    rows = plan.shards
    return {
        "job_id": [r.job_id for r in rows],
        "step": [r.step for r in rows],
        "rank": [r.rank for r in rows],
        "run_attempt": [r.run_attempt for r in rows],
        "epoch": [r.epoch for r in rows],
        "world_size": [r.world_size for r in rows],
        "uri": [r.uri for r in rows],
        "loss": [r.loss for r in rows],
        "metrics": [r.metrics_json for r in rows],
        "size_bytes": [r.size_bytes for r in rows],
        "sha256": [r.sha256 for r in rows],
        "extra": [r.extra_json for r in rows],
        "sqs_message_id": [r.sqs_message_id for r in rows],
        "reported_at": [r.reported_at for r in rows],
    }


def recount_params(plan: BatchPlan) -> dict[str, list[Any]]:
    """Key arrays for :data:`RECOUNT_CHECKPOINTS`."""
    return {
        "job_id": [r.job_id for r in plan.checkpoints],
        "step": [r.step for r in plan.checkpoints],
    }
