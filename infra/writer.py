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

from aws_cdk import Names
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra import constants
from infra.database import DatabaseAccess
from infra.database_function import ARCHITECTURE, RUNTIME, DatabaseFunction
from infra.network import PipelineNetwork
from infra.queueing import CheckpointQueues
from infra.settings import PipelineSettings
from lambda_writer import encode_job_prefixes

# What the event source mapping's poller does with the execution role: ReceiveMessage,
# DeleteMessage, GetQueueAttributes ("Execution role permissions",
# https://docs.aws.amazon.com/lambda/latest/dg/with-sqs.html,
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html; also exactly what
# AWS's managed AWSLambdaSQSQueueExecutionRole holds). Not ChangeMessageVisibility or GetQueueUrl,
# which CDK's SqsEventSource adds: the poller lets failed records reappear after the visibility
# timeout, and neither it nor the code calls either.
EVENT_SOURCE_ACTIONS = (
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
)
# SendMessageBatch is authorized as sqs:SendMessage
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-api-permissions-reference.html).
DLQ_ACTIONS = ("sqs:SendMessage",)
# A producer to (consumer of) an SSE-KMS queue needs these on its key
# (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-key-management.html);
# the pipeline's queues are SQS-managed SSE (infra/queueing.py), which needs none.
SEND_KMS_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")
RECEIVE_KMS_ACTIONS = ("kms:Decrypt",)

__all__ = [
    "ARCHITECTURE",
    "RUNTIME",
    "WriterFunction",
]


class WriterFunction(DatabaseFunction):
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
            environment={
                "DLQ_URL": queues.dlq.queue_url,
                # pydantic looks for plugins in every installed distribution's entry points when
                # the contract model is built at import; the writer has none, and the scan is
                # cold-start time (https://docs.pydantic.dev/latest/concepts/plugins/).
                "PYDANTIC_DISABLE_PLUGINS": "__all__",
                # Whose re-sends carry a replay's original sender (docs/deploy.md, "Who may
                # write which job").
                **(
                    {"REPLAY_PRINCIPAL_ID": settings.replay_principal_id}
                    if settings.replay_principal_id
                    else {}
                ),
                # The stricter mode: the job-id prefixes each principal may write.
                **(
                    {"JOB_PREFIXES": encode_job_prefixes(settings.job_prefixes)}
                    if settings.job_prefixes
                    else {}
                ),
            },
            reserved_concurrency=settings.writer_reserved_concurrency,
            # X-Ray shows where a slow batch spends its time (token, connect, borrow, statement);
            # the handler's Powertools Tracer adds the subsegments.
            tracing=lambda_.Tracing.ACTIVE,
        )
        # The mapping SqsEventSource would make (same construct id), without its
        # grantConsumeMessages: that adds sqs:GetQueueUrl, which nothing uses.
        self.event_source = self.function.add_event_source_mapping(
            f"SqsEventSource:{Names.node_unique_id(queues.queue.node)}",
            event_source_arn=queues.queue.queue_arn,
            # The FIFO maximum; FIFO event sources take no batching window
            # (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html).
            batch_size=constants.BATCH_SIZE,
            report_batch_item_failures=True,
            max_concurrency=settings.event_source_max_concurrency,
        )
        self._grant(queues.queue, EVENT_SOURCE_ACTIONS, RECEIVE_KMS_ACTIONS)
        # Not grant_send_messages: it adds GetQueueAttributes and GetQueueUrl; the writer is given
        # the DLQ's URL and only calls SendMessageBatch.
        self._grant(queues.dlq, DLQ_ACTIONS, SEND_KMS_ACTIONS)

    def _grant(
        self, queue: sqs.IQueue, actions: tuple[str, ...], kms_actions: tuple[str, ...]
    ) -> None:
        self.function.add_to_role_policy(
            iam.PolicyStatement(actions=list(actions), resources=[queue.queue_arn])
        )
        if queue.encryption_master_key is not None:
            self.function.add_to_role_policy(
                iam.PolicyStatement(
                    actions=list(kms_actions), resources=[queue.encryption_master_key.key_arn]
                )
            )
