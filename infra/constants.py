"""Pipeline numbers shared by the CDK stack, the local event source and the tests.

Plain Python (no aws_cdk import) so that the local pipeline and tests can use the same values the
deployed stack does.
"""

from __future__ import annotations

# Lambda's SQS event source on a FIFO queue takes at most 10 records per batch, with no batching
# window (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html).
BATCH_SIZE = 10

WRITER_TIMEOUT_S = 30
# "Set the source queue's visibility timeout to at least six times the timeout that you configure
# on your function" (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html).
VISIBILITY_TIMEOUT_S = 6 * WRITER_TIMEOUT_S

# "set the maxReceiveCount on the source queue's redrive policy to at least 5"
# (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html). With reserved
# concurrency 1 the event source cannot set MaximumConcurrency (minimum 2), so throttled batches
# come back with higher receive counts: we raise the count for that case.
MAX_RECEIVE_COUNT = 5
MAX_RECEIVE_COUNT_RESERVED_1 = 20

# Queue retention covers a long writer or database outage; 14 days is SQS's maximum
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-queues.html).
QUEUE_RETENTION_S = 14 * 24 * 3600
DLQ_RETENTION_S = 14 * 24 * 3600

QUEUE_NAME_SUFFIX = "-checkpoints.fifo"
DLQ_NAME_SUFFIX = "-checkpoints-dlq.fifo"

# The database role the writer logs in as (created by migration 0002_writer_role.sql).
WRITER_DB_USER = "ckpt_writer"

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

DB_PORT = 5432
DEFAULT_DB_NAME = "ckpt"
DEFAULT_MASTER_USER = "postgres"
# A full version: cfn-lint (W3691) flags the bare major "16" as deprecated for new instances;
# minor upgrades then come from auto_minor_version_upgrade.
POSTGRES_VERSION = "16.13"

# A borrow that cannot get a pooled connection fails after this long, well inside the writer's
# timeout, so the batch is retried instead of the function timing out
# (https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/rds-proxy-connections.html).
PROXY_BORROW_TIMEOUT_S = 10
DEFAULT_PROXY_MAX_CONNECTIONS_PERCENT = 20

METRICS_NAMESPACE = "CkptPipeline"
WRITER_SERVICE_NAME = "ckpt-writer"
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
