"""The CDK stack's numbers. Those the local stand-in shares come from ``ckpt_contract.deployment``.

Plain Python (no aws_cdk import) so that tests can use the same values the deployed stack does.
"""

from __future__ import annotations

from ckpt_contract import stack_context
from ckpt_contract.deployment import (
    BATCH_SIZE,
    DLQ_NAME_SUFFIX,
    DLQ_RETENTION_S,
    MAX_RECEIVE_COUNT,
    MAX_RECEIVE_COUNT_RESERVED_1,
    METRICS_NAMESPACE,
    PRUNER_DB_USER,
    QUEUE_NAME_SUFFIX,
    QUEUE_RETENTION_S,
    VISIBILITY_TIMEOUT_S,
    WRITER_DB_USER,
    WRITER_SERVICE_NAME,
    WRITER_TIMEOUT_S,
)

__all__ = [
    "BATCH_SIZE",
    "DLQ_NAME_SUFFIX",
    "DLQ_RETENTION_S",
    "MAX_RECEIVE_COUNT",
    "MAX_RECEIVE_COUNT_RESERVED_1",
    "METRICS_NAMESPACE",
    "PRUNER_DB_USER",
    "QUEUE_NAME_SUFFIX",
    "QUEUE_RETENTION_S",
    "VISIBILITY_TIMEOUT_S",
    "WRITER_DB_USER",
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

WRITER_MEMORY_MB = 256
MIGRATION_TIMEOUT_S = 300
MIGRATION_MEMORY_MB = 256

WRITER_HANDLER = "lambda_writer.handler.handler"
MIGRATION_HANDLER = "lambda_writer.migrate_handler.handler"

# Defaults of context keys (ckpt_contract.stack_context defines the keys), used on their own too.
DB_PORT = stack_context.DB_PORT
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
