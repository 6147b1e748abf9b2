"""The writer Lambda: SQS FIFO event source -> RDS Proxy (IAM auth) -> PostgreSQL.

Concurrency. Reserved concurrency (1 or 2) is what bounds the database connections, whatever the
number of ranks. But Lambda's SQS pollers do not respect reserved concurrency: when they fetch more
batches than the function may run, the invocations are throttled, the messages come back after the
visibility timeout with a higher receive count, and valid reports drift towards the DLQ. The event
source's ``ScalingConfig.MaximumConcurrency`` caps the pollers instead, so:

* reserved concurrency 2 -> MaximumConcurrency 2 (never above the reserved concurrency);
* reserved concurrency 1 -> MaximumConcurrency cannot be set (its minimum is 2), so the queue's
  maxReceiveCount is raised to ``MAX_RECEIVE_COUNT_RESERVED_1`` to absorb throttled receives.

(https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html,
https://aws.amazon.com/blogs/compute/introducing-maximum-concurrency-of-aws-lambda-functions-when-using-amazon-sqs-as-an-event-source/)
"""

from __future__ import annotations

from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from constructs import Construct

from infra import constants
from infra.database import DatabaseAccess
from infra.database_function import ARCHITECTURE, RUNTIME, DatabaseFunction
from infra.network import PipelineNetwork
from infra.queueing import CheckpointQueues
from infra.settings import PipelineSettings

__all__ = [
    "ARCHITECTURE",
    "RUNTIME",
    "CheckpointWriter",
]


class CheckpointWriter(DatabaseFunction):
    """``function`` (reserved concurrency 1-2, as ``ckpt_writer``) and its SQS ``event_source``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        code: lambda_.Code,
        network: PipelineNetwork,
        queues: CheckpointQueues,
        database: DatabaseAccess,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            settings=settings,
            code=code,
            network=network,
            database=database,
            handler=constants.WRITER_HANDLER,
            db_user=constants.WRITER_DB_USER,
            service=constants.WRITER_SERVICE_NAME,
            description="Checkpoint pipeline writer: SQS FIFO reports into PostgreSQL",
            timeout_s=constants.WRITER_TIMEOUT_S,
            memory_mb=constants.WRITER_MEMORY_MB,
            environment={"DLQ_URL": queues.dlq.queue_url},
            reserved_concurrency=settings.writer_reserved_concurrency,
            # X-Ray shows where a slow batch spends its time (token, connect, borrow, statement);
            # the handler's Powertools Tracer adds the subsegments.
            tracing=lambda_.Tracing.ACTIVE,
        )
        self.event_source = event_sources.SqsEventSource(
            queues.queue,
            # The FIFO maximum; FIFO event sources take no batching window
            # (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html).
            batch_size=constants.BATCH_SIZE,
            report_batch_item_failures=True,
            max_concurrency=settings.event_source_max_concurrency,
        )
        self.function.add_event_source(self.event_source)
        queues.dlq.grant_send_messages(self.function)
