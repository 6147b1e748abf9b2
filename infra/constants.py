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
