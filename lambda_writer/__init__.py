"""The pipeline's Lambda functions, one folder each, shipped as one code bundle:

* ``writer/``: drains the SQS FIFO queue of checkpoint reports into PostgreSQL;
* ``breaker/``: pauses the writer's event source mapping while the database is down;
* ``migrate/``: applies ``migrations/`` at deploy time;
* ``prune/``: retention (policy, plan, executor, reads) and the scheduled prune's handler;
* ``shared/``: what they all use (settings, connections, AWS clients, errors, and
  ``constants``: the deployment numbers the CDK stack reads too).

A function folder imports ``shared/`` and ``ckpt_contract`` only.
The names below are the package's public face: the rest of the repository imports them from
here, never from the submodules (``tests/contract/test_boundaries.py``), but for
``shared.constants``: the deployment numbers, plain values that the CDK app, the local stand-in
and the benches read as a module of their own. Each is imported on
first use (PEP 562): a Lambda function imports this package before its entry module, and its
cold start must not pay for the others' code (the writer's handler would otherwise drag in the
migrator, the breaker and boto3).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lambda_writer.breaker.circuit import HealthCheck, backoff_delay_s, check_database
    from lambda_writer.migrate.apply import apply_migrations, load_migrations
    from lambda_writer.migrate.exceptions import MigrationError
    from lambda_writer.prune.exceptions import PolicyError, PruneError
    from lambda_writer.prune.executor import (
        JobOutcome,
        NotDeleted,
        ObjectRemover,
        ObjectsRemoved,
        apply_job_plans,
        plan_jobs,
    )
    from lambda_writer.prune.policy import (
        JobPlan,
        Removal,
        RetentionPolicy,
        check_job_id,
        check_metric,
    )
    from lambda_writer.prune.reads import job_checkpoints, job_ids
    from lambda_writer.prune.records import CheckpointRow
    from lambda_writer.shared.connection import Connection, connect, connect_url
    from lambda_writer.shared.exceptions import SettingsError, WriterError
    from lambda_writer.shared.job_prefixes import encode_job_prefixes, parse_job_prefixes
    from lambda_writer.shared.settings import WriterSettings
    from lambda_writer.writer.batch import BatchResult
    from lambda_writer.writer.handler import (
        DoneHook,
        Handler,
        InvokeHook,
        WriterHandler,
        make_handler,
    )

# Public name -> the submodule that defines it.
_EXPORTS = {
    # One execution environment of the writer, built from explicit settings.
    "make_handler": "lambda_writer.writer.handler",
    "WriterHandler": "lambda_writer.writer.handler",
    "Handler": "lambda_writer.writer.handler",
    "InvokeHook": "lambda_writer.writer.handler",
    "DoneHook": "lambda_writer.writer.handler",
    "BatchResult": "lambda_writer.writer.batch",
    "WriterSettings": "lambda_writer.shared.settings",
    # The stricter ownership mode's map (the stack's context and the writer's JOB_PREFIXES).
    "parse_job_prefixes": "lambda_writer.shared.job_prefixes",
    "encode_job_prefixes": "lambda_writer.shared.job_prefixes",
    # Errors.
    "WriterError": "lambda_writer.shared.exceptions",
    "SettingsError": "lambda_writer.shared.exceptions",
    "MigrationError": "lambda_writer.migrate.exceptions",
    # The schema and connections (operator tools, the local stand-in).
    "apply_migrations": "lambda_writer.migrate.apply",
    "load_migrations": "lambda_writer.migrate.apply",
    "Connection": "lambda_writer.shared.connection",
    "connect": "lambda_writer.shared.connection",
    "connect_url": "lambda_writer.shared.connection",
    # The breaker's health check (poll's receive gate uses the same one).
    "HealthCheck": "lambda_writer.breaker.circuit",
    "backoff_delay_s": "lambda_writer.breaker.circuit",
    "check_database": "lambda_writer.breaker.circuit",
    # Retention: the policy, its plan, the executor and its reads (ckpt-pipeline prune and the
    # scheduled prune).
    "JobOutcome": "lambda_writer.prune.executor",
    "NotDeleted": "lambda_writer.prune.executor",
    "ObjectRemover": "lambda_writer.prune.executor",
    "ObjectsRemoved": "lambda_writer.prune.executor",
    "PruneError": "lambda_writer.prune.exceptions",
    "PolicyError": "lambda_writer.prune.exceptions",
    "RetentionPolicy": "lambda_writer.prune.policy",
    "JobPlan": "lambda_writer.prune.policy",
    "Removal": "lambda_writer.prune.policy",
    "check_job_id": "lambda_writer.prune.policy",
    "check_metric": "lambda_writer.prune.policy",
    "apply_job_plans": "lambda_writer.prune.executor",
    "plan_jobs": "lambda_writer.prune.executor",
    "CheckpointRow": "lambda_writer.prune.records",
    "job_checkpoints": "lambda_writer.prune.reads",
    "job_ids": "lambda_writer.prune.reads",
}

__all__ = [
    "BatchResult",
    "CheckpointRow",
    "Connection",
    "DoneHook",
    "Handler",
    "HealthCheck",
    "InvokeHook",
    "JobOutcome",
    "JobPlan",
    "MigrationError",
    "NotDeleted",
    "ObjectRemover",
    "ObjectsRemoved",
    "PolicyError",
    "PruneError",
    "Removal",
    "RetentionPolicy",
    "SettingsError",
    "WriterError",
    "WriterHandler",
    "WriterSettings",
    "apply_job_plans",
    "apply_migrations",
    "backoff_delay_s",
    "check_database",
    "check_job_id",
    "check_metric",
    "connect",
    "connect_url",
    "encode_job_prefixes",
    "job_checkpoints",
    "job_ids",
    "load_migrations",
    "make_handler",
    "parse_job_prefixes",
    "plan_jobs",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lambda_writer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
