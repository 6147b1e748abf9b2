"""The writer's one statement and its parameters (pure: no connection needed).

The batch goes to the database as two json texts, checkpoint rows and shard rows in the plan's
key order, in one round trip: on an autocommit connection (the writer's) to the procedure
``ckpt_write_batch_counted``, inside a caller's transaction to ``ckpt_write_batch_json`` (what
they do: docs/DESIGN.md, "The writer: counting shards in slot rows"). Parameterised only: the
json texts travel as bind parameters, and every value in them is encoded here (strings escaped
by the json module's own encoder), never spliced into SQL.

Why json and not 20 column arrays (0004's statement): for a batch of 10 records, psycopg's dumping
of 20 array parameters cost the client more than everything else it does per batch; building the
two texts costs a fraction of it (BENCHMARKS.md §2).
"""

from __future__ import annotations

from datetime import datetime
from json.encoder import encode_basestring

from lambda_writer.writer.planning import BatchPlan

# Migration 0018: the batch's job and launch claims, once for the batch, then 0007's procedure
# unchanged. Inside a caller's transaction: 0015's job claims, then 0006's function, whose rows
# 0014's trigger checks one by one (the claimed procedure's mark would outlive its statement).
WRITE_BATCH = "CALL ckpt_write_batch_claimed(%s::json, %s::json, %s::json, %s::json, NULL, NULL)"
WRITE_BATCH_IN_TRANSACTION = (
    "SELECT shard_rows_changed, checkpoints_recounted"
    " FROM ckpt_write_batch_owned_json(%s::json, %s::json, %s::json)"
)
# ckpt_claim_jobs' refusal of a job that belongs to another principal (migration 0015).
FOREIGN_SENDER_SQLSTATE = "23K01"

# The json module's C string encoder: quotes, backslashes and control characters are escaped,
# other characters pass as they are (the text is sent as UTF-8). json.dumps would do the same per
# call with more overhead; numbers below are ints and floats (the contract refuses NaN/inf), which
# repr() writes as valid JSON numbers that float8in/int8in read back exactly.
_q = encode_basestring


# What each record of a batch that changed fewer shard rows than it had records did (asked only
# then, so the log can say "dropped" or "unchanged" rather than "written"): dropped by a prune's
# tombstone (migration 0009), or whether its shard row now holds this very message (it landed).
RECORD_FATES = (
    "SELECT r.i,"
    " coalesce(r.run_attempt < t.min_run_attempt, false),"
    " coalesce(s.sqs_message_id = r.message_id, false)"
    " FROM unnest(%s::text[], %s::bigint[], %s::int[], %s::int[], %s::text[])"
    " WITH ORDINALITY AS r(job_id, step, rank, run_attempt, message_id, i)"
    " LEFT JOIN training_checkpoint_tombstones t USING (job_id, step)"
    " LEFT JOIN training_checkpoint_shards s"
    " ON s.job_id = r.job_id AND s.step = r.step AND s.rank = r.rank"
    " ORDER BY r.i"
)


def _opt_str(value: str | None) -> str:
    return "null" if value is None else _q(value)


def _opt_num(value: float | int | None) -> str:
    return "null" if value is None else repr(value)


def _ts(value: datetime) -> str:
    # ISO 8601 with its offset (reports' timestamps are timezone-aware): timestamptz reads it
    # back to the microsecond.
    return f'"{value.isoformat()}"'


def owners_param(plan: BatchPlan) -> str:
    """The batch's (job, owner principal, SenderId) as the json :data:`WRITE_BATCH` claims."""
    return "[{}]".format(
        ",".join(
            f'{{"job_id":{_q(job)},"owner":{_q(owner)},"sender":{_q(sender)}}}'
            for job, owner, sender in plan.senders
        )
    )


def launches_param(plan: BatchPlan) -> str:
    """The batch's launch claims (one per job, step, attempt and launch) as json."""
    return "[{}]".format(
        ",".join(
            f'{{"job_id":{_q(job)},"step":{step},"rank":{rank},"run_attempt":{attempt},'
            f'"launch_id":{_q(launch)}}}'
            for job, step, rank, attempt, launch in plan.launches
        )
    )


def claimed_write_params(plan: BatchPlan) -> tuple[str, str, str, str]:
    """(owners, launches, checkpoint rows, shard rows): :data:`WRITE_BATCH`'s parameters."""
    return (owners_param(plan), launches_param(plan), *write_params(plan))


def owned_write_params(plan: BatchPlan) -> tuple[str, str, str]:
    """(owners, checkpoint rows, shard rows): :data:`WRITE_BATCH_IN_TRANSACTION`'s parameters."""
    return (owners_param(plan), *write_params(plan))


def write_params(plan: BatchPlan) -> tuple[str, str]:
    """(checkpoint rows, shard rows) as json arrays for :data:`WRITE_BATCH`, in key order.

    ``metrics_json``/``extra_json``/``objects_json`` are already JSON texts (json.dumps in
    planning) and are embedded as they are, so jsonb receives the objects, not strings.
    """
    checkpoints = ",".join(
        f'{{"job_id":{_q(c.job_id)},"step":{c.step},"run_attempt":{c.run_attempt},'
        f'"epoch":{c.epoch},"world_size":{c.world_size},'
        f'"first_reported_at":{_ts(c.first_reported_at)}}}'
        for c in plan.checkpoints
    )
    shards = ",".join(
        f'{{"job_id":{_q(s.job_id)},"step":{s.step},"rank":{s.rank},'
        f'"run_attempt":{s.run_attempt},"epoch":{s.epoch},"world_size":{s.world_size},'
        f'"uri":{_q(s.uri)},"loss":{_opt_num(s.loss)},"metrics":{s.metrics_json},'
        f'"size_bytes":{_opt_num(s.size_bytes)},"sha256":{_opt_str(s.sha256)},'
        f'"extra":{s.extra_json},"sqs_message_id":{_q(s.sqs_message_id)},'
        f'"reported_at":{_ts(s.reported_at)},"objects":{s.objects_json}}}'
        for s in plan.shards
    )
    return f"[{checkpoints}]", f"[{shards}]"
