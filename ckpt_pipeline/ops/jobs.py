"""Who owns which job (migration 0015): the list, and an operator's transfer or release, audited.

A job belongs to the principal of its first report's SenderId; the writer refuses any other
principal's reports of it (docs/DESIGN.md, "Who may write a job"). A job moved to another role
is transferred to that role's id; a released job is claimed again by its next report's sender.
Every change writes its audit row (``ckpt_job_owner_changes``) in the same transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from ckpt_pipeline.exceptions import ConfigError, PipelineError
from lambda_writer import Connection

# An IAM unique id (AIDA…, AROA…) or, on an emulator, what it stamps (LocalStack: the account
# id): letters and digits, never the ":session" part of a role's SenderId.
_PRINCIPAL = re.compile(r"[A-Za-z0-9_+=,.@-]{1,128}")

# Every job with rows or an owner: its owner (NULL: not claimed since migration 0015), and the
# shape of its checkpoints.
LIST_JOBS = """
SELECT j.job_id, o.owner, o.first_sender, o.claimed_at,
       (SELECT count(*) FROM training_checkpoints c WHERE c.job_id = j.job_id),
       (SELECT max(c.step) FROM complete_checkpoints c WHERE c.job_id = j.job_id)
FROM (SELECT DISTINCT job_id FROM training_checkpoints
      UNION SELECT job_id FROM ckpt_job_owners) j
LEFT JOIN ckpt_job_owners o USING (job_id)
WHERE %(prefix)s::text IS NULL OR starts_with(j.job_id, %(prefix)s::text)
ORDER BY j.job_id
"""
# SHARE ROW EXCLUSIVE conflicts with the ROW EXCLUSIVE lock of the writer's claim (an INSERT,
# migration 0015) and with itself: batches in flight finish first, the next ones wait for this
# change, and two operators' changes run one after the other.
LOCK_OWNERS = "LOCK TABLE ckpt_job_owners IN SHARE ROW EXCLUSIVE MODE"
OWNER_OF = "SELECT owner FROM ckpt_job_owners WHERE job_id = %s"
SET_OWNER = """
INSERT INTO ckpt_job_owners (job_id, owner, first_sender) VALUES (%(job)s, %(owner)s, %(owner)s)
ON CONFLICT (job_id) DO UPDATE SET owner = EXCLUDED.owner, claimed_at = now()
"""
RELEASE = "DELETE FROM ckpt_job_owners WHERE job_id = %s"
AUDIT = """
INSERT INTO ckpt_job_owner_changes (job_id, action, old_owner, new_owner, reason)
VALUES (%s, %s, %s, %s, %s) RETURNING changed_by, changed_at
"""


@dataclass(frozen=True)
class JobOwner:
    """One job and who owns it."""

    job_id: str
    owner: str | None
    first_sender: str | None
    claimed_at: datetime | None
    checkpoints: int
    newest_complete_step: int | None


@dataclass(frozen=True)
class OwnerChange:
    """An operator's change of a job's owner, as audited."""

    job_id: str
    action: str
    old_owner: str | None
    new_owner: str | None
    changed_by: str
    changed_at: datetime


def check_principal(value: str) -> str:
    """An owner as the writer records it: a principal id, not a SenderId with its session."""
    if ":" in value:
        raise ConfigError(
            "--to",
            f"must be a principal id without a session (the part before ':'), got {value!r}",
        )
    if not _PRINCIPAL.fullmatch(value):
        raise ConfigError(
            "--to", f"must be a role's or user's unique id (AROA…, AIDA…), got {value!r}"
        )
    return value


def check_reason(value: str) -> str:
    """A change's reason: required, one line."""
    text = " ".join(value.split())
    if not text:
        raise ConfigError("--reason", "must say why (it is recorded with the change)")
    return text


def list_jobs(conn: Connection, *, prefix: str | None = None) -> list[JobOwner]:
    """Every job with rows or an owner, by job id."""
    rows = conn.execute(LIST_JOBS, {"prefix": prefix}).fetchall()
    return [
        JobOwner(job, owner, sender, claimed, int(count), None if step is None else int(step))
        for job, owner, sender, claimed, count, step in rows
    ]


def job_owner(conn: Connection, job_id: str) -> str | None:
    """The job's owner, or None when no report or operator has claimed it."""
    row = conn.execute(OWNER_OF, (job_id,)).fetchone()
    return None if row is None else str(row[0])


def transfer(conn: Connection, job_id: str, new_owner: str, *, reason: str) -> OwnerChange:
    """Make ``new_owner`` the job's owner (also of a job not claimed yet), audited."""
    with conn.transaction():
        conn.execute(LOCK_OWNERS)
        row = conn.execute(OWNER_OF, (job_id,)).fetchone()
        old = None if row is None else str(row[0])
        conn.execute(SET_OWNER, {"job": job_id, "owner": new_owner})
        return _audit(conn, job_id, "transfer", old, new_owner, reason)


def release(conn: Connection, job_id: str, *, reason: str) -> OwnerChange:
    """Remove the job's owner, audited: the next report's sender claims it."""
    with conn.transaction():
        conn.execute(LOCK_OWNERS)
        row = conn.execute(OWNER_OF, (job_id,)).fetchone()
        if row is None:
            raise PipelineError(f"job {job_id!r} has no owner: nothing to release")
        conn.execute(RELEASE, (job_id,))
        return _audit(conn, job_id, "release", str(row[0]), None, reason)


def _audit(
    conn: Connection, job_id: str, action: str, old: str | None, new: str | None, reason: str
) -> OwnerChange:
    row = conn.execute(AUDIT, (job_id, action, old, new, reason)).fetchone()
    assert row is not None  # INSERT … RETURNING one row
    return OwnerChange(job_id, action, old, new, str(row[0]), row[1])
