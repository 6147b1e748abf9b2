"""Lambda writer: drains the SQS FIFO queue of checkpoint reports into PostgreSQL.

The names below are the package's public face: the rest of the repository imports them from
here, never from the submodules (``tests/contract/test_boundaries.py``). Each is imported on
first use (PEP 562): a Lambda function imports this package before its entry module, and its
cold start must not pay for the others' code (``lambda_writer.handler`` would otherwise drag in
the migrator, the breaker and boto3).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lambda_writer.breaker import HealthCheck, backoff_delay_s, check_database
    from lambda_writer.connection import Connection, connect, connect_url
    from lambda_writer.exceptions import MigrationError, SettingsError, WriterError
    from lambda_writer.handler import (
        DoneHook,
        Handler,
        InvokeHook,
        WriterHandler,
        make_handler,
    )
    from lambda_writer.migrate import apply_migrations, load_migrations
    from lambda_writer.prune import (
        JobOutcome,
        NotDeleted,
        ObjectRemover,
        ObjectsRemoved,
        PruneError,
        apply_job_plans,
        plan_jobs,
    )
    from lambda_writer.prune_reads import CheckpointRow, job_checkpoints, job_ids
    from lambda_writer.settings import WriterSettings
    from lambda_writer.writer import BatchResult

# Public name -> the submodule that defines it.
_EXPORTS = {
    # One execution environment of the writer, built from explicit settings.
    "make_handler": "lambda_writer.handler",
    "WriterHandler": "lambda_writer.handler",
    "Handler": "lambda_writer.handler",
    "InvokeHook": "lambda_writer.handler",
    "DoneHook": "lambda_writer.handler",
    "BatchResult": "lambda_writer.writer",
    "WriterSettings": "lambda_writer.settings",
    # Errors.
    "WriterError": "lambda_writer.exceptions",
    "SettingsError": "lambda_writer.exceptions",
    "MigrationError": "lambda_writer.exceptions",
    # The schema and connections (operator tools, the local stand-in).
    "apply_migrations": "lambda_writer.migrate",
    "load_migrations": "lambda_writer.migrate",
    "Connection": "lambda_writer.connection",
    "connect": "lambda_writer.connection",
    "connect_url": "lambda_writer.connection",
    # The breaker's health check (poll's receive gate uses the same one).
    "HealthCheck": "lambda_writer.breaker",
    "backoff_delay_s": "lambda_writer.breaker",
    "check_database": "lambda_writer.breaker",
    # Retention's executor (ckpt-pipeline prune and the scheduled prune) and its reads.
    "JobOutcome": "lambda_writer.prune",
    "NotDeleted": "lambda_writer.prune",
    "ObjectRemover": "lambda_writer.prune",
    "ObjectsRemoved": "lambda_writer.prune",
    "PruneError": "lambda_writer.prune",
    "apply_job_plans": "lambda_writer.prune",
    "plan_jobs": "lambda_writer.prune",
    "CheckpointRow": "lambda_writer.prune_reads",
    "job_checkpoints": "lambda_writer.prune_reads",
    "job_ids": "lambda_writer.prune_reads",
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
    "MigrationError",
    "NotDeleted",
    "ObjectRemover",
    "ObjectsRemoved",
    "PruneError",
    "SettingsError",
    "WriterError",
    "WriterHandler",
    "WriterSettings",
    "apply_job_plans",
    "apply_migrations",
    "backoff_delay_s",
    "check_database",
    "connect",
    "connect_url",
    "job_checkpoints",
    "job_ids",
    "load_migrations",
    "make_handler",
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
