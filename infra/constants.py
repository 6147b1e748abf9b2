"""The CDK stack's numbers. The deployment numbers the functions share (handlers, memory,
timeouts, port, roles, queues) are defined in ``lambda_writer.shared.constants`` and re-exported.

Plain Python (no aws_cdk import) so that tests can use the same values the deployed stack does.
"""

from __future__ import annotations

from ckpt_stack import context as stack_context
from lambda_writer.shared.constants import (
    BATCH_SIZE,
    BREAKER_HANDLER,
    BREAKER_MEMORY_MB,
    BREAKER_SERVICE_NAME,
    BREAKER_TIMEOUT_S,
    DB_PORT,
    DLQ_NAME_SUFFIX,
    DLQ_RETENTION_S,
    MAX_RECEIVE_COUNT,
    MAX_RECEIVE_COUNT_RESERVED_1,
    METRICS_NAMESPACE,
    MIGRATION_HANDLER,
    MIGRATION_MEMORY_MB,
    MIGRATION_TIMEOUT_S,
    PRUNER_DB_USER,
    PRUNER_HANDLER,
    PRUNER_MEMORY_MB,
    PRUNER_SERVICE_NAME,
    PRUNER_TIMEOUT_S,
    QUEUE_NAME_SUFFIX,
    QUEUE_RETENTION_S,
    VISIBILITY_TIMEOUT_S,
    WRITER_DB_USER,
    WRITER_HANDLER,
    WRITER_MEMORY_MB,
    WRITER_SERVICE_NAME,
    WRITER_TIMEOUT_S,
)

__all__ = [
    "BATCH_SIZE",
    "BREAKER_HANDLER",
    "BREAKER_MEMORY_MB",
    "BREAKER_SERVICE_NAME",
    "BREAKER_TIMEOUT_S",
    "DB_PORT",
    "DLQ_NAME_SUFFIX",
    "DLQ_RETENTION_S",
    "MAX_RECEIVE_COUNT",
    "MAX_RECEIVE_COUNT_RESERVED_1",
    "METRICS_NAMESPACE",
    "MIGRATION_HANDLER",
    "MIGRATION_MEMORY_MB",
    "MIGRATION_TIMEOUT_S",
    "PRUNER_DB_USER",
    "PRUNER_HANDLER",
    "PRUNER_MEMORY_MB",
    "PRUNER_SERVICE_NAME",
    "PRUNER_TIMEOUT_S",
    "QUEUE_NAME_SUFFIX",
    "QUEUE_RETENTION_S",
    "VISIBILITY_TIMEOUT_S",
    "WRITER_DB_USER",
    "WRITER_HANDLER",
    "WRITER_MEMORY_MB",
    "WRITER_SERVICE_NAME",
    "WRITER_TIMEOUT_S",
]

# --- CDK stack values (added with the CDK app; still plain Python) ---

# The newest Python runtime aws-cdk-lib 2.275 knows: cdk-nag's AwsSolutions-L1 asks for the latest
# of the family. The bundler installs wheels for this exact CPython (pydantic-core and
# psycopg-binary are ABI-specific), so runtime and wheels come from this one value.
LAMBDA_PYTHON_VERSION = "3.14"
# Graviton: cheaper per GB-second than x86 for the same work
# (https://docs.aws.amazon.com/lambda/latest/dg/foundation-arch.html).
LAMBDA_ARCHITECTURE = "arm64"

# Defaults of context keys (ckpt_stack.context defines the keys), used on their own too.
DEFAULT_DB_NAME = stack_context.DEFAULT_DB_NAME
DEFAULT_MASTER_USER = stack_context.DEFAULT_MASTER_USER
# The major version only: RDS then creates the major's default minor and, with
# auto_minor_version_upgrade, moves the instance to the minors it designates, so a new deploy keeps
# working after AWS retires any one minor (a pinned "16.13" would fail to create then)
# (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/USER_UpgradeDBInstance.PostgreSQL.Minor.html,
# https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/API_ModifyDBInstance.html: "If you
# specify only a major version, Amazon RDS updates the DB instance to the default minor version").
POSTGRES_MAJOR_VERSION = "16"

# A borrow that cannot get a pooled connection fails after this long, well inside the writer's
# timeout, so the batch is retried instead of the function timing out
# (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-connections.html).
PROXY_BORROW_TIMEOUT_S = 10
DEFAULT_PROXY_MAX_CONNECTIONS_PERCENT = stack_context.DEFAULT_PROXY_MAX_CONNECTIONS_PERCENT

MIGRATION_SERVICE_NAME = "ckpt-migrate"
# EMF metrics the writer emits (Powertools adds the ``service`` dimension).
WRITER_METRICS = (
    "RecordsWritten",
    "PoisonRecords",
    "TransientFailures",
    "BatchLatencyMs",
    "RowsChanged",
    "NoopReplays",
)

# A report older than this in the main queue means the writer is stuck or far behind.
QUEUE_AGE_ALARM_S = 900
ALARM_PERIOD_S = 300
