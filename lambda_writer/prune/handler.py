"""Lambda entry point of the scheduled prune (an EventBridge schedule; off unless the stack's
context turns it on, see docs/operations.md "Scheduled prune").

It runs :func:`lambda_writer.plan_jobs` and :func:`lambda_writer.apply_job_plans`, the executor of
``ckpt-pipeline prune --all --apply``, with the policy of ``PRUNE_POLICY`` (JSON,
``lambda_writer.prune.policy.RetentionPolicy``), as role ``ckpt_pruner``. Rows only: the function
cannot see the trainers' ``file://`` paths, so nothing beyond the policy is protected by a file
check; what stays is what the database says (its latest complete checkpoint per job, the policy's
keep-last/keep-best/keep-every, everything in progress). Objects stay where they are.

One structured log line per job that lost rows, two EMF metrics per run (``CheckpointsPruned``,
``ShardRowsPruned``) under the ``ckpt-pruner`` service, and a raise on any failure, so the
function's Errors metric (and its alarm) shows it. A run that nears its timeout stops taking
new jobs; the next run goes on from there.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from lambda_writer.prune.exceptions import PolicyError
from lambda_writer.prune.executor import JobOutcome, apply_job_plans, plan_jobs
from lambda_writer.prune.policy import RetentionPolicy
from lambda_writer.shared.connection import connect
from lambda_writer.shared.constants import PRUNER_SERVICE_NAME
from lambda_writer.shared.exceptions import SettingsError
from lambda_writer.shared.settings import WriterSettings, metrics_namespace

logger = Logger(service=PRUNER_SERVICE_NAME)
logging.getLogger("botocore").setLevel(logging.WARNING)
metrics = Metrics(namespace=metrics_namespace(), service=PRUNER_SERVICE_NAME)

# Stop taking new jobs this long before the function's deadline (one job's chunks fit in it).
STOP_BEFORE_DEADLINE_MS = 60_000


@dataclass(frozen=True)
class PrunerSettings:
    """The pruner's configuration: its database settings and the policy."""

    database: WriterSettings
    policy: RetentionPolicy

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PrunerSettings:
        """``PRUNE_POLICY`` + the database variables; raises :class:`SettingsError`."""
        env = os.environ if env is None else env
        text = env.get("PRUNE_POLICY", "").strip()
        if not text:
            raise SettingsError("PRUNE_POLICY", "is required (the retention policy, JSON)")
        try:
            policy = RetentionPolicy.from_json(text)
        except PolicyError as exc:
            raise SettingsError("PRUNE_POLICY", f"{exc.name}: {exc.rule}") from None
        return cls(database=WriterSettings.from_env(env), policy=policy)


@dataclass(frozen=True)
class PruneRun:
    """What one scheduled run removed, per job that lost rows."""

    outcomes: tuple[JobOutcome, ...]
    jobs_planned: int
    stopped_early: bool

    @property
    def checkpoints(self) -> int:
        return sum(len(o.removed) for o in self.outcomes)

    @property
    def shard_rows(self) -> int:
        return sum(r.shard_rows for o in self.outcomes for r in (*o.removed, *o.superseded))

    def as_dict(self) -> dict[str, object]:
        return {
            "jobs_planned": self.jobs_planned,
            "checkpoints_pruned": self.checkpoints,
            "shard_rows_pruned": self.shard_rows,
            "stopped_early": self.stopped_early,
        }


def run_prune(settings: PrunerSettings, *, remaining_ms: Callable[[], int]) -> PruneRun:
    """Plan every job and apply, job by job, while ``remaining_ms()`` leaves room."""
    outcomes: list[JobOutcome] = []
    stopped = False
    with connect(settings.database, autocommit=True) as conn:
        plans = plan_jobs(conn, settings.policy)
        for plan in plans:
            if plan.is_empty:
                continue
            if remaining_ms() < STOP_BEFORE_DEADLINE_MS:
                stopped = True
                break
            outcome = apply_job_plans(conn, [plan], settings.policy)[0]
            outcomes.append(outcome)
            logger.info(
                "pruned",
                extra={
                    "job_id": outcome.job_id,
                    "steps": [r.step for r in outcome.removed],
                    "superseded_steps": [r.step for r in outcome.superseded],
                    "kept_changed": outcome.kept_changed,
                },
            )
    return PruneRun(tuple(outcomes), len(plans), stopped)


@functools.cache
def _settings() -> PrunerSettings:
    return PrunerSettings.from_env()


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict[str, Any], context: Any) -> dict[str, object]:
    """One scheduled prune; returns what it removed."""
    metrics.clear_metrics()  # see lambda_writer.writer.handler: start each run from an empty set
    run = run_prune(_settings(), remaining_ms=context.get_remaining_time_in_millis)
    metrics.add_metric(name="CheckpointsPruned", unit=MetricUnit.Count, value=run.checkpoints)
    metrics.add_metric(name="ShardRowsPruned", unit=MetricUnit.Count, value=run.shard_rows)
    if run.stopped_early:
        logger.warning("stopped before its deadline; the next run goes on", extra=run.as_dict())
    else:
        logger.info("scheduled prune done", extra=run.as_dict())
    return run.as_dict()
