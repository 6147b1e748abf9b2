"""Writes a planned batch to PostgreSQL in one round trip: the count in one transaction, then its
settle in a second one, both inside one ``CALL``.

The write algorithm
-------------------
A batch (≤ 10 SQS records) is merged into one row per checkpoint ``(job_id, step)`` and one per
shard ``(job_id, step, rank)``, sorted by key (:mod:`lambda_writer.planning`), and sent as two
json parameters to ``CALL ckpt_write_batch_counted(…)`` (:mod:`lambda_writer.sql`; migration
``0006_write_batch_slot_counts.sql``, with the procedure body of
``0007_write_batch_lock_before_count.sql``), which does, in this order:

0. Each checkpoint's advisory lock, shared (held to the commit: see the in-transaction callers
   below; two calls of the procedure never wait for each other on it).
1. One statement (``ckpt_count_batch``):
   a. ``INSERT … ON CONFLICT DO UPDATE … WHERE EXCLUDED.run_attempt > stored … RETURNING`` all
      shard rows (0004/0005's text): a newer attempt replaces the shard, the same attempt is a
      no-op replay, an older one never overwrites a newer one. RETURNING lists the rows moved.
   b. Per checkpoint of the batch, ``delta`` = the moved rows of the batch's (newest) attempt.
   c. The checkpoint upsert, only where this statement's snapshot does not show a stored row
      already holding the batch's values (newest attempt; within it max world_size/epoch; min
      first_reported_at). That is a checkpoint's first batch, a newer attempt (which restarts the
      row's part of the count at 0), a larger world_size: a handful per checkpoint attempt.
   d. ``delta`` added to the count row ``(job_id, step, run_attempt, pg_backend_pid())``: this
      backend's own row, which no concurrent transaction writes.
2. ``COMMIT``: the records are durable.
3. Settle, in a new transaction: one read of whether an attempt of the batch now has
   ``world_size`` shards counted (row part + count rows) but is not marked complete; only then
   (once per attempt) ``ckpt_settle_checkpoints`` locks its row and moves its count rows into
   ``shards_present``; ``is_complete`` and ``completed_at`` follow. The read takes no lock and
   no transaction id, so no WAL flush.

Nothing is locked by two writers of one checkpoint in the same batch's life, except the first
batches that create or raise its row and the settle once per attempt; in particular no lock is
held by one writer across the other's commit (0004/0005 held the checkpoint row through it).

Why it is correct under concurrency and replays (the full argument: docs/DESIGN.md, "The writer:
counting shards in slot rows"; forced interleavings: tests/lambda_writer/test_interleavings.py)
--------------------------------------------------------------------------------------------
* The count of the row's attempt A is ``shards_present`` + the count rows of A
  (``training_checkpoint_progress``): each move of a shard to A is credited once, in the
  transaction that made it (facts (b)-(d) of 0004's argument, unchanged), to a row that only
  adds; a settle moves amounts from the count rows into ``shards_present`` in one transaction
  (``DELETE … RETURNING`` hands back exactly what it removed). Exact at every snapshot.
* ``is_complete`` is set only under the row lock from what the settle moved, so never early; and
  the last batch of an attempt to commit settles it, because its settle runs after its commit and
  sees every batch committed before. A settle that never ran (the connection dropped after the
  commit) fails the CALL: the records are retried, and the redelivery (counting nothing) settles.
* No deadlock: every writer locks shard rows, then checkpoint rows, then count rows, each in key
  order (each CTE reads all of the previous one), and a settle a checkpoint row, then its count
  rows; the foreign-key checks take KEY SHARE, which no writer's lock conflicts with.
* Order-independence: each column's update is a join of a semilattice (max attempt; within it
  max world_size/epoch; min first_reported_at; a shard is replaced only by a strictly newer
  attempt), which is commutative, associative and idempotent, and the count is, after any order,
  the number of shards of the newest attempt. The in-batch merge applies the same join, so any
  permutation/duplication of a set of reports ends in the same rows (timestamps of the write
  itself — written_at/updated_at/completed_at — aside). A report's identity is (job,
  run_attempt, step, rank), its dedup id: two different bodies with one identity are a client
  bug, and then the first one written stays (with its sqs_message_id).
* Nothing half-written: the count is one statement in its own transaction; any error — timeout,
  constraint, dropped connection — rolls all of it back, the delta with the shard rows it counts.
* One round trip per batch: through RDS Proxy that is the difference between 1 and 5 network
  round trips (BEGIN, 3 statements, COMMIT).

Inside a caller's transaction (``autocommit`` off) a procedure cannot commit, so the batch goes
to ``ckpt_write_batch_json`` instead (0005's function, 0006's body: the same count and settle in
that one transaction, under the checkpoint's advisory lock taken exclusively, so it and a CALL
wait for each other's commit before counting and the second one's settle sees the first); the
previous release's writer calls the same function during a rolling deploy.

No session state is created (no SET, PREPARE, session advisory locks, temp tables, cursors WITH
HOLD), so a connection through RDS Proxy or PgBouncer in transaction mode is never pinned: the
proxy sees one CALL, and the transaction-level advisory lock of the settle is inside it.
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
    # Checkpoint rows inserted, raised or settled (the OUT name is 0003's, kept so that 0004
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
            # One CALL: the count commits inside it, then the settle runs in its own
            # transaction; one round trip, nothing left open.
            row = conn.execute(sql.WRITE_BATCH, sql.write_params(plan)).fetchone()
        else:
            with conn.transaction():
                row = conn.execute(
                    sql.WRITE_BATCH_IN_TRANSACTION, sql.write_params(plan)
                ).fetchone()
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
