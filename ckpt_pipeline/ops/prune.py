"""``ckpt-pipeline prune``: plan (dry run) and apply a retention policy, without racing the writer.

Planning reads each job's checkpoints and asks :func:`ckpt_pipeline.ops.retention.plan_job`.
Applying works in chunks of :data:`CHUNK` checkpoints, one transaction each (the argument is in
docs/DESIGN.md, "Retention: tombstones"):

1. ``ckpt_lock_checkpoints_for_prune``: the chunk's advisory locks, exclusive, in the writers'
   order; a writer of them that holds one commits first, any later one waits for this commit.
2. Read the job again and plan again with the same policy and protected steps; lock the rows the
   new plan keeps complete ``FOR SHARE`` (no new attempt can make them incomplete before the
   commit) and start over if one changed in between.
3. Remove the chunk's planned checkpoints that the new plan still removes, each only if its row
   is still what the dry run saw (``ckpt_remove_checkpoints``: rows, shard rows, count rows, a
   tombstone); the same for superseded shard rows (``ckpt_remove_superseded``). With
   ``delete_objects``, a checkpoint's objects are deleted first, and one whose objects were not
   all deleted keeps its rows.

So ``--apply`` removes what the dry run printed, or less (what changed since), never more.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ckpt_pipeline.exceptions import PipelineError
from ckpt_pipeline.ops.checkpoint_reads import job_checkpoints, job_ids
from ckpt_pipeline.ops.prune_objects import NotDeleted, ObjectDeletion, delete_objects
from ckpt_pipeline.ops.retention import JobPlan, Removal, RetentionPolicy, plan_job
from lambda_writer import connect_url

logger = logging.getLogger(__name__)

# Checkpoints per transaction: bounds how long the chunk's locks (and, with --delete-objects,
# the object deletions inside it) hold off the writers of those checkpoints.
CHUNK = 16
_REPLANS = 5


class PruneError(PipelineError):
    """The prune could not run (the database changed under it too often, bad input)."""


@dataclass
class JobOutcome:
    """What ``--apply`` removed from one job."""

    job_id: str
    removed: list[Removal] = field(default_factory=list)
    superseded: list[Removal] = field(default_factory=list)
    kept_changed: list[int] = field(default_factory=list)
    objects_deleted: int = 0
    not_deleted: list[NotDeleted] = field(default_factory=list)


def protected_steps(
    database_url: str, job_id: str, policy: RetentionPolicy, *, check_files: bool
) -> dict[int, str]:
    """The resume target and the best checkpoint as the helpers name them (storage-verified)."""
    from trainer_client.integrations.best import best_complete_checkpoint
    from trainer_client.integrations.exceptions import IntegrationError
    from trainer_client.integrations.resume import latest_complete_checkpoint

    out: dict[int, str] = {}
    try:
        latest = latest_complete_checkpoint(
            job_id, database_url=database_url, check_files=check_files
        )
        best = (
            best_complete_checkpoint(
                job_id,
                metric=policy.metric,
                mode=policy.mode,
                database_url=database_url,
                check_files=check_files,
            )
            if policy.keep_best and policy.metric is not None
            else None
        )
    except IntegrationError as exc:
        raise PruneError(f"job {job_id}: {exc}") from None
    if latest is not None:
        out[latest.step] = "resume target"
    if best is not None:
        out[best.step] = f"best {policy.metric}"
    return out


def plan_prune(
    database_url: str,
    policy: RetentionPolicy,
    *,
    jobs: Sequence[str] | None = None,
    check_files: bool = True,
) -> list[JobPlan]:
    """The dry run: one plan per job (every job when ``jobs`` is None)."""
    with connect_url(database_url, autocommit=True) as conn:
        names = job_ids(conn) if jobs is None else list(jobs)
        plans = []
        for job_id in names:
            protected = protected_steps(database_url, job_id, policy, check_files=check_files)
            states = [r.state for r in job_checkpoints(conn, job_id, metric=policy.metric)]
            plans.append(plan_job(job_id, states, policy, protected=protected))
    return plans


def apply_plans(
    database_url: str,
    plans: Iterable[JobPlan],
    policy: RetentionPolicy,
    *,
    delete_objects: bool = False,
    check_files: bool = True,
    s3_client: Any = None,
) -> list[JobOutcome]:
    """Remove what ``plans`` (from :func:`plan_prune`) remove, as far as it still holds.

    ``s3_client``: for ``delete_objects`` on ``s3://`` (default: boto3's standard configuration).
    """
    deletion = ObjectDeletion(s3_client) if delete_objects else None
    outcomes = []
    with connect_url(database_url) as conn:
        for plan in plans:
            outcome = JobOutcome(plan.job_id)
            if not plan.is_empty:
                protected = protected_steps(
                    database_url, plan.job_id, policy, check_files=check_files
                )
                for chunk in _chunks(plan):
                    _apply_chunk(conn, plan.job_id, chunk, policy, protected, outcome, deletion)
            outcomes.append(outcome)
    return outcomes


def _chunks(plan: JobPlan) -> list[tuple[list[Removal], list[Removal]]]:
    items = [(True, r) for r in plan.remove] + [(False, r) for r in plan.superseded]
    chunks = []
    for start in range(0, len(items), CHUNK):
        part = items[start : start + CHUNK]
        chunks.append(([r for whole, r in part if whole], [r for whole, r in part if not whole]))
    return chunks


def _apply_chunk(
    conn: Any,
    job_id: str,
    chunk: tuple[list[Removal], list[Removal]],
    policy: RetentionPolicy,
    protected: dict[int, str],
    outcome: JobOutcome,
    deletion: ObjectDeletion | None,
) -> None:
    whole, superseded = chunk
    steps = sorted({r.step for r in whole} | {r.step for r in superseded})
    for _ in range(_REPLANS):
        try:
            with conn.transaction():
                _apply_locked(
                    conn,
                    job_id,
                    whole,
                    superseded,
                    steps,
                    policy,
                    protected,
                    outcome,
                    deletion,
                )
        except _Retry:
            continue  # a kept checkpoint changed between the read and its lock: plan again
        return
    raise PruneError(f"job {job_id}: its kept checkpoints kept changing; try again")


class _Retry(Exception):
    """A kept checkpoint changed between the read and its lock."""


def _apply_locked(
    conn: Any,
    job_id: str,
    whole: list[Removal],
    superseded: list[Removal],
    steps: list[int],
    policy: RetentionPolicy,
    protected: dict[int, str],
    outcome: JobOutcome,
    deletion: ObjectDeletion | None,
) -> None:
    conn.execute("SELECT ckpt_lock_checkpoints_for_prune(%s, %s::bigint[])", (job_id, steps))
    states = [r.state for r in job_checkpoints(conn, job_id, metric=policy.metric)]
    replan = plan_job(job_id, states, policy, protected=protected)
    if not _lock_kept(conn, job_id, replan, states):
        raise _Retry
    now_whole = {_identity(r) for r in replan.remove}
    now_superseded = {(r.step, r.run_attempt) for r in replan.superseded}
    go_whole = [r for r in whole if _identity(r) in now_whole]
    go_superseded = [r for r in superseded if (r.step, r.run_attempt) in now_superseded]
    outcome.kept_changed.extend(
        r.step for r in whole + superseded if r not in go_whole + go_superseded
    )
    if deletion is not None:
        failed = delete_objects(conn, job_id, go_whole, go_superseded, deletion)
        outcome.objects_deleted += deletion.deleted
        outcome.not_deleted.extend(deletion.not_deleted)
        deletion.deleted, deletion.not_deleted = 0, []
        go_whole = [r for r in go_whole if r.step not in failed]
        go_superseded = [r for r in go_superseded if r.step not in failed]
    outcome.removed.extend(_remove(conn, "ckpt_remove_checkpoints", job_id, go_whole))
    outcome.superseded.extend(_remove(conn, "ckpt_remove_superseded", job_id, go_superseded))


def _identity(r: Removal) -> tuple[int, int, int, bool]:
    return (r.step, r.run_attempt, r.world_size, r.is_complete)


def _lock_kept(conn: Any, job_id: str, plan: JobPlan, states: list[Any]) -> bool:
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


def _remove(conn: Any, function: str, job_id: str, removals: list[Removal]) -> list[Removal]:
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


def connect_check(database_url: str) -> None:
    """Fail early, with one line, when the database lacks the retention functions."""
    try:
        with connect_url(database_url, autocommit=True) as conn:
            conn.execute("SELECT 'ckpt_remove_checkpoints(text, json)'::regprocedure")
    except psycopg.errors.UndefinedFunction:
        raise PruneError("database: no retention functions: run `ckpt-pipeline migrate`") from None
