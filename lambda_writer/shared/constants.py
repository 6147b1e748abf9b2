"""Deployment numbers: what the functions, the CDK stack and the local stand-in must agree on.

Each function's handler, memory and timeout, the queues' numbers, the database's port and roles,
the metrics' namespace and services. The functions read them at run time; the CDK app
(``infra.constants`` re-exports them) deploys with them; the local emulation
(``ckpt_pipeline.local``) behaves the same way. Plain values, no imports: reading this module costs
a cold start nothing, and no runtime code imports ``infra``.
"""

from __future__ import annotations

# Lambda's SQS event source on a FIFO queue takes at most 10 records per batch, with no batching
# window (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html).
BATCH_SIZE = 10

WRITER_TIMEOUT_S = 30
# "Set the source queue's visibility timeout to at least six times the timeout that you configure
# on your function" (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html).
VISIBILITY_TIMEOUT_S = 6 * WRITER_TIMEOUT_S

# --- The functions: handler (module.function in the one bundle), memory, timeout ---------------
WRITER_HANDLER = "lambda_writer.writer.handler.handler"
WRITER_MEMORY_MB = 256
MIGRATION_HANDLER = "lambda_writer.migrate.handler.handler"
MIGRATION_MEMORY_MB = 256
MIGRATION_TIMEOUT_S = 300
BREAKER_HANDLER = "lambda_writer.breaker.handler.handler"
BREAKER_MEMORY_MB = 256
PRUNER_HANDLER = "lambda_writer.prune.handler.handler"
PRUNER_MEMORY_MB = 256

# The writer's circuit breaker (lambda_writer.breaker, deployed by infra.breaker). Its function's
# timeout must hold one database check (lambda_writer.shared.connection.CONNECT_TIMEOUT_S, plus a
# secret read under the breaker's client budget when DB_AUTH=secret) and two mapping calls at their
# worst case: 5 + 11 + 2 x 11 = 38 s; 45 s leaves room for the query and the runtime.
BREAKER_TIMEOUT_S = 45
# The writer's EMF namespace and Powertools service (the ``service`` dimension of its metrics and
# log lines): the handler emits under them, the stack's alarms and dashboard name them.
METRICS_NAMESPACE = "CkptPipeline"
WRITER_SERVICE_NAME = "ckpt-writer"
# The breaker's Powertools service: the ``service`` dimension of its EMF metrics, which the
# stack's alarms and dashboard name (infra.breaker), and of its log lines.
BREAKER_SERVICE_NAME = "ckpt-breaker"

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

# Local queue names only: the stack lets CloudFormation name its queues.
QUEUE_NAME_SUFFIX = "-checkpoints.fifo"
DLQ_NAME_SUFFIX = "-checkpoints-dlq.fifo"

# PostgreSQL's port: the default of the context's dbPort and of DB_PORT; RDS Proxy for PostgreSQL
# listens on it whatever the instance's own port.
DB_PORT = 5432
# The database role the writer logs in as (created by migration 0002_writer_role.sql).
WRITER_DB_USER = "ckpt_writer"
# The role the scheduled prune logs in as (created by migration 0011_pruner_role.sql).
PRUNER_DB_USER = "ckpt_pruner"
# The scheduled prune (lambda_writer.prune.handler, deployed by infra.pruner): its Powertools
# service and its function's timeout. A run stops taking new jobs a minute before it (the next
# run goes on from there); the role's statement_timeout (60 s) bounds the chunk in flight.
PRUNER_SERVICE_NAME = "ckpt-pruner"
PRUNER_TIMEOUT_S = 300
