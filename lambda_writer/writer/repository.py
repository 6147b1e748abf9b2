"""Writes a planned batch to PostgreSQL in one round trip: the job and launch claims and the count
in one transaction, then its settle in a second one, both inside one
``CALL ckpt_write_batch_claimed(…)`` (inside a caller's transaction, where a procedure cannot
commit: ``ckpt_write_batch_owned_json``, the same claims, count and settle in that transaction).

The algorithm, and why it is exact under concurrency, replays and stale attempts, is explained
in one place: docs/DESIGN.md, "The writer: counting shards in slot rows" (forced interleavings:
tests/lambda_writer/test_interleavings.py). This module only maps the outcome and the errors:
a refused value is permanent (the same rows would be refused again), anything else transient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import psycopg

from lambda_writer.shared.connection import Connection, redact
from lambda_writer.shared.exceptions import TransientWriteError
from lambda_writer.writer import sql
from lambda_writer.writer.exceptions import PermanentWriteError
from lambda_writer.writer.planning import BatchPlan
from lambda_writer.writer.records import ValidReport

# The error class of a report refused by the launch guard (migration 0014 raises SQLSTATE 23C01):
# what the DLQ envelope and the writer's log name.
LAUNCH_CONFLICT = "LaunchConflict"
_LAUNCH_CONFLICT_STATE = "23C01"


@dataclass(frozen=True)
class WriteOutcome:
    """What a committed batch changed."""

    records: int
    shard_rows_changed: int
    # Checkpoint rows inserted, raised or settled by the batch (the SQL OUT column keeps its
    # first name, checkpoints_recounted, so that later migrations could replace the function
    # in place).
    checkpoint_rows_changed: int

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
            row = conn.execute(sql.WRITE_BATCH, sql.claimed_write_params(plan)).fetchone()
        else:
            with conn.transaction():
                row = conn.execute(
                    sql.WRITE_BATCH_IN_TRANSACTION, sql.owned_write_params(plan)
                ).fetchone()
    except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as exc:
        if exc.sqlstate == sql.FOREIGN_SENDER_SQLSTATE:
            # The job belongs to another principal: the same report is refused on every retry.
            # The message names the job and both principals, nothing of the report.
            raise PermanentWriteError("ForeignSender", _first_line(exc)) from exc
        # The data itself is refused (a constraint or a value out of the column's range, or
        # another launch's run_attempt): the same rows will be refused on every retry.
        if exc.sqlstate == _LAUNCH_CONFLICT_STATE:
            raise PermanentWriteError(LAUNCH_CONFLICT, _describe(exc)) from exc
        raise PermanentWriteError(type(exc).__name__, _describe(exc)) from exc
    except psycopg.Error as exc:
        # Connection failures, QueryCanceled (statement_timeout), LockNotAvailable, deadlock,
        # serialization failures, and also deployment faults (missing table, privilege): retry;
        # the queue's maxReceiveCount moves a record that never succeeds to the DLQ.
        raise TransientWriteError(_describe(exc)) from exc
    shard_rows, checkpoint_rows = row if row is not None else (0, 0)
    return WriteOutcome(plan.records, int(shard_rows), int(checkpoint_rows))


class RecordFate(NamedTuple):
    """What one record of a batch did, read back after the batch committed."""

    dropped: bool  # a prune's tombstone refused it
    landed: bool  # its shard row holds this very message


def record_fates(conn: Connection, reports: Sequence[ValidReport]) -> list[RecordFate]:
    """Each record's fate, in order (raises psycopg's): asked only after a batch that changed
    fewer shard rows than it had records, for the log."""
    if not reports:
        return []
    columns: list[list[object]] = [[], [], [], [], []]
    for valid in reports:
        r = valid.report
        for column, value in zip(
            columns,
            (r.job_id, r.step, r.rank, r.run_attempt, valid.message.message_id),
            strict=True,
        ):
            column.append(value)
    with conn.transaction():  # never an open transaction left on the writer's connection
        rows = conn.execute(sql.RECORD_FATES, columns).fetchall()
    return [RecordFate(bool(dropped), bool(landed)) for _i, dropped, landed in rows]


def _first_line(exc: psycopg.Error) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _describe(exc: psycopg.Error) -> str:
    state = exc.sqlstate or "client"
    return redact(f"{type(exc).__name__} [{state}]: {_first_line(exc)}")
