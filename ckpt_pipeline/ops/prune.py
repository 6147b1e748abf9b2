"""``ckpt-pipeline prune``: plan (dry run) and apply a retention policy, without racing the writer.

The plan is :func:`lambda_writer.prune.policy.plan_job` and the executor ``lambda_writer``'s
(:func:`lambda_writer.apply_job_plans`, the argument in its module and in docs/DESIGN.md,
"Retention: tombstones"), the same the scheduled prune's Lambda runs. What the CLI adds: the
resume target and the best checkpoint as the trainers' helpers name them (they check the files,
so they can be older than the database's) are protected, and ``--delete-objects`` deletes the
removed rows' objects first (:mod:`ckpt_pipeline.ops.prune_objects`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from ckpt_pipeline.exceptions import PipelineError
from ckpt_pipeline.ops.prune_objects import ObjectDeletion
from lambda_writer import (
    JobOutcome,
    JobPlan,
    PruneError,
    RetentionPolicy,
    apply_job_plans,
    connect_url,
    plan_jobs,
)


def protected_steps(
    database_url: str, job_id: str, policy: RetentionPolicy, *, check_files: bool
) -> dict[int, str]:
    """The resume target and the best checkpoint as the helpers name them (storage-verified)."""
    from trainer_client.exceptions import IntegrationError
    from trainer_client.restart.best import best_complete_checkpoint
    from trainer_client.restart.lookup import latest_complete_checkpoint
    from trainer_client.storage.exceptions import StorageError

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
    except (IntegrationError, StorageError) as exc:
        raise PipelineError(f"job {job_id}: {exc}") from None
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
        return plan_jobs(
            conn,
            policy,
            jobs=jobs,
            protected=lambda job: protected_steps(
                database_url, job, policy, check_files=check_files
            ),
        )


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
    with connect_url(database_url, autocommit=True) as conn:
        try:
            return apply_job_plans(
                conn,
                plans,
                policy,
                protected=lambda job: protected_steps(
                    database_url, job, policy, check_files=check_files
                ),
                remove_objects=ObjectDeletion(s3_client) if delete_objects else None,
            )
        except PruneError as exc:  # the executor's: the CLI reports it as its own failure
            raise PipelineError(str(exc)) from None


def connect_check(database_url: str) -> None:
    """Fail early, with one line, when the database lacks the retention functions."""
    try:
        with connect_url(database_url, autocommit=True) as conn:
            conn.execute("SELECT 'ckpt_remove_checkpoints(text, json)'::regprocedure")
    except psycopg.errors.UndefinedFunction:
        raise PipelineError(
            "database: no retention functions: run `ckpt-pipeline migrate`"
        ) from None
