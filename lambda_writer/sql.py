"""The writer's one statement and its parameters (pure: no connection needed).

The batch goes to the database as column arrays, in the plan's key order, to
``ckpt_write_batch`` (migration ``0004_write_batch_delta_count.sql``), which runs one set-based
statement — the shard UPSERT, then the checkpoint UPSERT with the batch's delta — in one round
trip.
Parameterised only: every value travels as a bind parameter.
"""

from __future__ import annotations

from typing import Any

from lambda_writer.planning import BatchPlan

# Binary parameters (%(name)b): dumping arrays in binary costs the client about half the CPU of
# text arrays (measured by bench/writer_throughput.py). Explicit casts pick the function's
# signature whatever types psycopg infers for the lists (an all-NULL list has no element type).
WRITE_BATCH = """
SELECT shard_rows_changed, checkpoints_recounted FROM ckpt_write_batch(
    %(c_job_id)b::text[], %(c_step)b::bigint[], %(c_run_attempt)b::integer[],
    %(c_epoch)b::bigint[], %(c_world_size)b::integer[], %(c_first_reported_at)b::timestamptz[],
    %(s_job_id)b::text[], %(s_step)b::bigint[], %(s_rank)b::integer[],
    %(s_run_attempt)b::integer[], %(s_epoch)b::bigint[], %(s_world_size)b::integer[],
    %(s_uri)b::text[], %(s_loss)b::double precision[], %(s_metrics)b::text[]::jsonb[],
    %(s_size_bytes)b::bigint[], %(s_sha256)b::text[], %(s_extra)b::text[]::jsonb[],
    %(s_sqs_message_id)b::text[], %(s_reported_at)b::timestamptz[])
"""


def write_params(plan: BatchPlan) -> dict[str, list[Any]]:
    """Column arrays for :data:`WRITE_BATCH`, in key order (the order rows are locked in)."""
    cps, shards = plan.checkpoints, plan.shards
    return {
        "c_job_id": [r.job_id for r in cps],
        "c_step": [r.step for r in cps],
        "c_run_attempt": [r.run_attempt for r in cps],
        "c_epoch": [r.epoch for r in cps],
        "c_world_size": [r.world_size for r in cps],
        "c_first_reported_at": [r.first_reported_at for r in cps],
        "s_job_id": [r.job_id for r in shards],
        "s_step": [r.step for r in shards],
        "s_rank": [r.rank for r in shards],
        "s_run_attempt": [r.run_attempt for r in shards],
        "s_epoch": [r.epoch for r in shards],
        "s_world_size": [r.world_size for r in shards],
        "s_uri": [r.uri for r in shards],
        "s_loss": [r.loss for r in shards],
        "s_metrics": [r.metrics_json for r in shards],
        "s_size_bytes": [r.size_bytes for r in shards],
        "s_sha256": [r.sha256 for r in shards],
        "s_extra": [r.extra_json for r in shards],
        "s_sqs_message_id": [r.sqs_message_id for r in shards],
        "s_reported_at": [r.reported_at for r in shards],
    }
