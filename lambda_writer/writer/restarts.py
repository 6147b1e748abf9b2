"""Restart records into ``training_job_restarts`` (migration 0017): one row per launch, written
idempotently (a re-send or a replay is the same row), in one transaction per batch.

Errors map as the reports' do (repository.py): a value the database refuses is permanent (the
record goes to the DLQ), anything else transient (the batch's records are retried)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg

from lambda_writer.shared.connection import Connection, redact
from lambda_writer.shared.exceptions import TransientWriteError
from lambda_writer.writer.exceptions import PermanentWriteError
from lambda_writer.writer.records import ValidRestart, principal_of

INSERT_RESTART = """
INSERT INTO training_job_restarts (
    job_id, run_attempt, launch_id, world_size, resumed_step, resumed_run_attempt,
    resumed_world_size, skipped, skipped_total, waited_reports, unwritten_reports,
    unsent_reports, deadline_cut, decided_s, restored_s, fetched_bytes, max_node_fetched_bytes,
    nodes_fetched, source, newest_saved_step, loop_restarts, loop_after, restarted_at,
    sqs_message_id)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
        %s, %s, %s, %s)
ON CONFLICT (job_id, run_attempt, launch_id) DO NOTHING
"""


def _row(valid: ValidRestart) -> tuple[object, ...]:
    r = valid.record
    return (
        r.job_id,
        r.run_attempt,
        r.launch_id or "",
        r.world_size,
        r.resumed_step,
        r.resumed_run_attempt,
        r.resumed_world_size,
        json.dumps([s.model_dump(exclude_none=True) for s in r.skipped]),
        r.skipped_total,
        r.waited_reports,
        r.unwritten_reports,
        r.unsent_reports,
        r.deadline_cut,
        r.decided_s,
        r.restored_s,
        r.fetched_bytes,
        r.max_node_fetched_bytes,
        r.nodes_fetched,
        r.source,
        r.newest_saved_step,
        r.loop_restarts,
        r.loop_after,
        r.created_at,
        valid.message.message_id,
    )


# A restart record is its job's like a report (migration 0015): the first sender claims a job
# without an owner, another principal's record is refused (SQLSTATE 23K01), in this transaction.
CLAIM_JOBS = "SELECT ckpt_claim_jobs(%s::json)"
_FOREIGN_SENDER_STATE = "23K01"


def _owners(restarts: Sequence[ValidRestart]) -> str:
    first: dict[tuple[str, str], str] = {}
    for valid in restarts:
        sender = valid.message.sender_id or ""
        first.setdefault((valid.record.job_id, principal_of(sender)), sender)
    return json.dumps(
        [
            {"job_id": job, "owner": owner, "sender": sender}
            for (job, owner), sender in first.items()
        ]
    )


def write_restarts(conn: Connection, restarts: Sequence[ValidRestart]) -> int:
    """Insert ``restarts`` in one transaction, each job checked against its owner as reports are;
    the rows inserted (0 for replays)."""
    if not restarts:
        return 0
    try:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(CLAIM_JOBS, (_owners(restarts),))
            inserted = 0
            for valid in restarts:
                cur.execute(INSERT_RESTART, _row(valid))
                inserted += cur.rowcount
            return inserted
    except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as exc:
        if exc.sqlstate == _FOREIGN_SENDER_STATE:
            first = (str(exc).strip().splitlines() or ["foreign sender"])[0]
            raise PermanentWriteError("ForeignSender", redact(first)) from exc
        raise PermanentWriteError(type(exc).__name__, _describe(exc)) from exc
    except psycopg.Error as exc:
        raise TransientWriteError(_describe(exc)) from exc


def _describe(exc: psycopg.Error) -> str:
    state = exc.sqlstate or "client"
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return redact(f"{type(exc).__name__} [{state}]: {first_line}")
