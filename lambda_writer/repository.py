"""Writes a planned batch to PostgreSQL in one statement (one transaction, one round trip).

The write algorithm
-------------------
A batch (≤ 10 SQS records) is merged into one row per checkpoint ``(job_id, step)`` and one per
shard ``(job_id, step, rank)``, sorted by key (:mod:`lambda_writer.planning`), and sent as two
json parameters in ONE statement, ``SELECT … FROM ckpt_write_batch_json(…)``
(:mod:`lambda_writer.sql`; migration ``0005_write_batch_json.sql``: the statement of
``0004_write_batch_delta_count.sql``, which replaced 0003's recount, fed json instead of 20
arrays), whose one SQL statement does, in this order:

1. ``INSERT … ON CONFLICT DO UPDATE … WHERE EXCLUDED.run_attempt > stored … RETURNING`` all shard
   rows: a newer attempt replaces the shard, the same attempt is a no-op replay, an older one
   never overwrites a newer one. RETURNING lists the rows this batch inserted or moved.
2. Per checkpoint of the batch, ``delta`` = the returned rows of the batch's (newest) attempt for
   that checkpoint.
3. ``INSERT … ON CONFLICT DO UPDATE … WHERE`` all checkpoint rows. The newest ``run_attempt``
   wins; a newer attempt restarts the count at ``delta``; the same attempt adds ``delta`` (and
   only raises world_size/epoch); an older one changes no count. ``is_complete`` and
   ``completed_at`` follow from the new count.

The cost per batch is independent of the checkpoint's world_size (0003 recounted all its shards
every batch), and the checkpoint row is locked only for step 3, the foreign-key checks and the
commit, so writers of one checkpoint overlap their shard work.

Why it is correct under concurrency and replays (the full argument: docs/DESIGN.md, "The writer:
counting shards without recounting"; forced interleavings: tests/lambda_writer/
test_interleavings.py)
--------------------------------------------------------------------------------------------
* No lost or double count: every read-modify-write of a checkpoint's count is serialised on its
  row (ON CONFLICT locks it and works on its newest committed version), and each shard row moves
  to a given attempt at most once (its own row lock and the strictly-newer WHERE). So the count
  of attempt A is the number of shard moves to A credited after the reset to A, each credited by
  the transaction that made it, in the same commit.
* No deadlock: every writer locks its shard rows, then its checkpoint rows, each in key order
  (step 2's ``count(*)`` reads all of step 1 before step 3 writes its first row); the
  foreign-key checks take KEY SHARE, which no writer's lock on a checkpoint row conflicts with.
* Order-independence: each column's update is a join of a semilattice (max attempt; within it
  max world_size/epoch; min first_reported_at; a shard is replaced only by a strictly newer
  attempt), which is commutative, associative and idempotent, and the count is, after any order,
  the number of shards of the newest attempt. The in-batch merge applies the same join, so any
  permutation/duplication of a set of reports ends in the same rows (timestamps of the write
  itself — written_at/updated_at/completed_at — aside). A report's identity is (job,
  run_attempt, step, rank), its dedup id: two different bodies with one identity are a client
  bug, and then the first one written stays (with its sqs_message_id).
* Nothing half-written: the steps are one statement (on an autocommit connection, its own
  transaction); any error — timeout, constraint, dropped connection — rolls all of it back, the
  count's delta with the shard rows it counts.
* One round trip per batch: through RDS Proxy that is the difference between 1 and 5 network
  round trips (BEGIN, 3 statements, COMMIT), and row locks are held for the shortest time.

No session state is created (no SET, PREPARE, advisory locks, temp tables, cursors WITH HOLD),
so a connection through RDS Proxy or PgBouncer in transaction mode is never pinned.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from lambda_writer import sql
from lambda_writer.connection import Connection, redact
from lambda_writer.exceptions import PermanentWriteError, TransientWriteError
from lambda_writer.planning import BatchPlan


@dataclass(frozen=True)
class WriteOutcome:
    """What a committed batch changed."""

    records: int
    shard_rows_changed: int
    # Checkpoint rows inserted or updated (the function's OUT name is 0003's, kept so that 0004
    # could replace the function in place: nothing is recounted any more).
    checkpoints_recounted: int

    @property
    def noop_replays(self) -> int:
        """Records that changed no shard row (same or older attempt already stored)."""
        return self.records - self.shard_rows_changed


def write_batch(conn: Connection, plan: BatchPlan) -> WriteOutcome:
    """Write ``plan`` in one transaction; raises Transient/PermanentWriteError, never psycopg's."""
    if not plan.shards:
        return WriteOutcome(0, 0, 0)
    try:
        if conn.autocommit:
            # One statement is its own transaction: one round trip, nothing left open.
            row = conn.execute(sql.WRITE_BATCH, sql.write_params(plan)).fetchone()
        else:
            with conn.transaction():
                row = conn.execute(sql.WRITE_BATCH, sql.write_params(plan)).fetchone()
    except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as exc:
        # The data itself is refused (a constraint or a value out of the column's range): the
        # same rows will be refused on every retry.
        raise PermanentWriteError(type(exc).__name__, _describe(exc)) from exc
    except psycopg.Error as exc:
        # Connection failures, QueryCanceled (statement_timeout), LockNotAvailable, deadlock,
        # serialization failures, and also deployment faults (missing table, privilege): retry;
        # the queue's maxReceiveCount moves a record that never succeeds to the DLQ.
        raise TransientWriteError(_describe(exc)) from exc
    changed, recounted = row if row is not None else (0, 0)
    return WriteOutcome(plan.records, int(changed), int(recounted))


def _describe(exc: psycopg.Error) -> str:
    state = exc.sqlstate or "client"
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return redact(f"{type(exc).__name__} [{state}]: {first_line}")
