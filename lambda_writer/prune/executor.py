"""Apply a retention policy without racing the writer: the executor of ``ckpt-pipeline prune``
and of the scheduled prune's Lambda (one definition; the plan is ``lambda_writer.prune.policy``).

Planning reads each job's checkpoints and asks :func:`lambda_writer.prune.policy.plan_job`.
Applying works in chunks of :data:`CHUNK` checkpoints, one transaction each (the argument is in
docs/DESIGN.md, "Retention: tombstones"):

1. ``ckpt_lock_checkpoints_for_prune``: the chunk's advisory locks, exclusive, in the writers'
   order; a writer of them that holds one commits first, any later one waits for this commit.
2. Read the job again and plan again with the same policy and protected steps; lock the rows the
   new plan keeps complete ``FOR SHARE`` (no new attempt can make them incomplete before the
   commit) and start over if one changed in between.
3. Remove the chunk's planned checkpoints that the new plan still removes, each only if its row
   is still what the dry run saw (``ckpt_remove_checkpoints``: rows, shard rows, count rows, a
   tombstone); the same for superseded shard rows (``ckpt_remove_superseded``). With an object
   remover, a checkpoint's objects are deleted first, and one whose objects were not all deleted
   keeps its rows.

So an apply removes what the dry run printed, or less (what changed since), never more.

What is protected beyond the policy (the resume target and the best checkpoint as the trainers'
helpers name them, which check the files) is the caller's: the CLI asks the helpers, the Lambda,
which cannot see the trainers' files, passes nothing (the database's latest complete checkpoint
and the policy's keep-best are kept by the plan itself).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lambda_writer.prune.exceptions import PruneError
from lambda_writer.prune.policy import JobPlan, Removal, RetentionPolicy, plan_job
from lambda_writer.prune.reads import job_checkpoints, job_ids
from lambda_writer.shared.connection import Connection

# Checkpoints per transaction: bounds how long the chunk's locks (and any object deletions
# inside it) hold off the writers of those checkpoints.
CHUNK = 16
_REPLANS = 5

# job_id -> {step: why it stays}, whatever the policy says.
ProtectedSteps = Callable[[str], dict[int, str]]


@dataclass(frozen=True)
class NotDeleted:
    """A stored object that was not deleted, and why; its checkpoint's rows stay."""

    step: int
    uri: str
    reason: str


@dataclass
class ObjectsRemoved:
    """What one object remover call did: ``failed``, the steps whose rows must stay."""

    deleted: int = 0
    not_deleted: list[NotDeleted] = field(default_factory=list)
    failed: set[int] = field(default_factory=set)


class ObjectRemover(Protocol):
    """Deletes the objects of the rows about to go, inside the chunk's transaction."""

    def __call__(
        self, conn: Connection, job_id: str, whole: list[Removal], superseded: list[Removal]
    ) -> ObjectsRemoved: ...


@dataclass
class JobOutcome:
    """What an apply removed from one job."""

    job_id: str
    removed: list[Removal] = field(default_factory=list)
    superseded: list[Removal] = field(default_factory=list)
    kept_changed: list[int] = field(default_factory=list)
    objects_deleted: int = 0
    not_deleted: list[NotDeleted] = field(default_factory=list)


def _nothing_protected(job_id: str) -> dict[int, str]:
    return {}


def plan_jobs(
    conn: Connection,
    policy: RetentionPolicy,
    *,
    jobs: Sequence[str] | None = None,
    protected: ProtectedSteps = _nothing_protected,
) -> list[JobPlan]:
    """The dry run: one plan per job (every job with a checkpoint row when ``jobs`` is None)."""
    names = job_ids(conn) if jobs is None else list(jobs)
    return [
        plan_job(
            job_id,
            job_checkpoints(conn, job_id, metric=policy.metric),
            policy,
            protected=protected(job_id),
        )
        for job_id in names
    ]


def apply_job_plans(
    conn: Connection,
    plans: Iterable[JobPlan],
    policy: RetentionPolicy,
    *,
    protected: ProtectedSteps = _nothing_protected,
    remove_objects: ObjectRemover | None = None,
) -> list[JobOutcome]:
    """Remove what ``plans`` (from :func:`plan_jobs`) remove, as far as it still holds.

    ``conn`` must be in autocommit mode: each chunk is its own transaction, and no statement
    outside one may leave a transaction open around them.
    """
    if not conn.autocommit:
        raise PruneError("apply_job_plans: the connection must be in autocommit mode")
    outcomes = []
    for plan in plans:
        outcome = JobOutcome(plan.job_id)
        if not plan.is_empty:
            job = _JobApply(
                conn, plan.job_id, policy, protected(plan.job_id), outcome, remove_objects
            )
            for chunk in _chunks(plan):
                _apply_chunk(job, chunk)
        outcomes.append(outcome)
    return outcomes


def _chunks(plan: JobPlan) -> list[tuple[list[Removal], list[Removal]]]:
    items = [(True, r) for r in plan.remove] + [(False, r) for r in plan.superseded]
    chunks = []
    for start in range(0, len(items), CHUNK):
        part = items[start : start + CHUNK]
        chunks.append(([r for whole, r in part if whole], [r for whole, r in part if not whole]))
    return chunks


class _Retry(Exception):
    """A kept checkpoint changed between the read and its lock."""


@dataclass(frozen=True)
class _JobApply:
    """What every chunk of one job's apply shares: where, how it replans, and what it records."""

    conn: Connection
    job_id: str
    policy: RetentionPolicy
    protected: dict[int, str]
    outcome: JobOutcome
    remove_objects: ObjectRemover | None


def _apply_chunk(job: _JobApply, chunk: tuple[list[Removal], list[Removal]]) -> None:
    for _ in range(_REPLANS):
        try:
            with job.conn.transaction():
                _apply_locked(job, chunk)
        except _Retry:
            continue  # a kept checkpoint changed between the read and its lock: plan again
        return
    raise PruneError(f"job {job.job_id}: its kept checkpoints kept changing; try again")


def _apply_locked(job: _JobApply, chunk: tuple[list[Removal], list[Removal]]) -> None:
    conn, job_id, outcome, remove_objects = job.conn, job.job_id, job.outcome, job.remove_objects
    whole, superseded = chunk
    steps = sorted({r.step for r in whole} | {r.step for r in superseded})
    conn.execute("SELECT ckpt_lock_checkpoints_for_prune(%s, %s::bigint[])", (job_id, steps))
    states = job_checkpoints(conn, job_id, metric=job.policy.metric)
    replan = plan_job(job_id, states, job.policy, protected=job.protected)
    if not _lock_kept(conn, job_id, replan, states):
        raise _Retry
    now_whole = {_identity(r) for r in replan.remove}
    now_superseded = {(r.step, r.run_attempt) for r in replan.superseded}
    go_whole = [r for r in whole if _identity(r) in now_whole]
    go_superseded = [r for r in superseded if (r.step, r.run_attempt) in now_superseded]
    outcome.kept_changed.extend(
        r.step for r in whole + superseded if r not in go_whole + go_superseded
    )
    if remove_objects is not None:
        done = remove_objects(conn, job_id, go_whole, go_superseded)
        outcome.objects_deleted += done.deleted
        outcome.not_deleted.extend(done.not_deleted)
        go_whole = [r for r in go_whole if r.step not in done.failed]
        go_superseded = [r for r in go_superseded if r.step not in done.failed]
    outcome.removed.extend(_remove(conn, "ckpt_remove_checkpoints", job_id, go_whole))
    outcome.superseded.extend(_remove(conn, "ckpt_remove_superseded", job_id, go_superseded))


def _identity(r: Removal) -> tuple[int, int, int, bool]:
    return (r.step, r.run_attempt, r.world_size, r.is_complete)


def _lock_kept(conn: Connection, job_id: str, plan: JobPlan, states: list[Any]) -> bool:
    """Lock the complete checkpoints ``plan`` keeps FOR SHARE; False if one changed since read."""
    seen = {s.step: (s.run_attempt, s.world_size, s.is_complete) for s in states if s.is_complete}
    kept = sorted(step for step in plan.kept if step in seen)
    rows = conn.execute(
        "SELECT step, run_attempt, world_size, is_complete FROM training_checkpoints"
        " WHERE job_id = %s AND step = ANY(%s::bigint[]) ORDER BY step FOR SHARE",
        (job_id, kept),
    ).fetchall()
    now = {int(s): (int(a), int(w), bool(c)) for s, a, w, c in rows}
    return all(now.get(step) == seen[step] for step in kept)


def _remove(conn: Connection, function: str, job_id: str, removals: list[Removal]) -> list[Removal]:
    if not removals:
        return []
    wanted = json.dumps(
        [
            {
                "step": r.step,
                "run_attempt": r.run_attempt,
                "world_size": r.world_size,
                "is_complete": r.is_complete,
            }
            for r in removals
        ]
    )
    by_step = {r.step: r for r in removals}
    rows = conn.execute(
        f"SELECT step, run_attempt, shard_rows FROM {function}(%s, %s::json)", (job_id, wanted)
    ).fetchall()
    out = []
    for step, _attempt, shard_rows in rows:
        planned = by_step[int(step)]
        out.append(
            Removal(
                planned.step,
                planned.run_attempt,
                planned.world_size,
                planned.is_complete,
                int(shard_rows),
                planned.value,
            )
        )
    return out
