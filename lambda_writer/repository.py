"""Writes a planned batch to PostgreSQL in one statement (one transaction, one round trip).

The write algorithm
-------------------
A batch (≤ 10 SQS records) is merged into one row per checkpoint ``(job_id, step)`` and one per
shard ``(job_id, step, rank)``, sorted by key (:mod:`lambda_writer.planning`), and sent as column
arrays in ONE statement, ``SELECT … FROM ckpt_write_batch(…)`` (:mod:`lambda_writer.sql`; the
function is migration ``0003_write_batch_function.sql``), which runs, in one transaction:

1. ``INSERT … ON CONFLICT DO UPDATE … WHERE`` all checkpoint rows. The newest ``run_attempt``
   wins; a newer attempt resets the row's count and completeness; the same attempt only raises
   world_size/epoch; an older one changes nothing. ON CONFLICT locks each existing row even when
   its WHERE is false, and a fresh row is locked by its insert, so after this statement the
   transaction holds every touched checkpoint row, taken in key order.
2. ``INSERT … ON CONFLICT DO UPDATE … WHERE EXCLUDED.run_attempt > stored`` all shard rows: a
   newer attempt replaces the shard, the same attempt is a no-op replay (counted by rowcount),
   an older one never overwrites a newer one.
3. Recount the touched checkpoints: ``shards_present`` = shards whose run_attempt equals the
   checkpoint's, ``is_complete`` = that count reaches world_size, ``completed_at`` set when it
   first does for this attempt.

Why it is correct under concurrency and replays
-----------------------------------------------
* No deadlock: a shard row is only written by a transaction that already holds its checkpoint's
  row lock (step 1 precedes step 2), so writers contend only on checkpoint rows, and every writer
  takes those in the same global key order; waits therefore form no cycle.
* No lost count: the function is VOLATILE, so (READ COMMITTED) step 3 takes its own snapshot,
  after step 1 acquired the locks: every writer that touched these checkpoints before has
  committed and is visible; every later one waits behind our lock and recounts after us. The
  count is recomputed, never incremented, so replays cannot double-count.
* Order-independence: each column's update is a join of a semilattice (max attempt; within it
  max world_size/epoch; min first_reported_at; a shard is replaced only by a strictly newer
  attempt), which is commutative, associative and idempotent. The in-batch merge applies the same
  join, so any permutation/duplication of a set of reports ends in the same rows (timestamps of
  the write itself — written_at/updated_at/completed_at — aside). A report's identity is
  (job, run_attempt, step, rank), its dedup id: two different bodies with one identity are a
  client bug, and then the first one written stays (with its sqs_message_id).
* Nothing half-written: the three steps are one statement (on an autocommit connection, its own
  transaction); any error — timeout, constraint, dropped connection — rolls all of it back.
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
