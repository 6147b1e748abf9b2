"""The SQS FIFO queue the trainers send to, and its FIFO dead-letter queue."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra import constants
from infra.settings import PipelineSettings


class CheckpointQueues(Construct):
    """``queue`` (FIFO, explicit dedup ids, SSE, TLS only) and ``dlq`` (FIFO, 14 days)."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: PipelineSettings) -> None:
        super().__init__(scope, construct_id)
        # Deleting the stack must not delete reports in flight or poison waiting for a replay: the
        # queues stay (SQS still drops messages after their retention period). A retained queue
        # with a CloudFormation-made name never blocks the next stack.
        removal = RemovalPolicy.RETAIN if settings.retains_data else RemovalPolicy.DESTROY
        # SQS-managed SSE: encrypted at rest with no key policy to manage and no kms:* grants for
        # the trainers or the writer (a customer key would need kms:GenerateDataKey/Decrypt on
        # every sender and the event source) — https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-server-side-encryption.html
        self.dlq = sqs.Queue(
            self,
            "DeadLetterQueue",
            # No queue_name: CloudFormation names both queues (ending in .fifo), so a replacement
            # or a second stack never collides; trainers and operators get the URLs from the
            # stack outputs, never from a name.
            fifo=True,
            # The writer and the replay CLI send with explicit dedup ids, like the trainers.
            content_based_deduplication=False,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.seconds(constants.DLQ_RETENTION_S),
            removal_policy=removal,
        )
        # High-throughput FIFO: dedup per message group + per-group throughput quota
        # (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/high-throughput-fifo.html).
        # Safe for our ids: the dedup id hashes job|attempt|step|rank and the group is
        # job:rank, so one report's id never occurs in two groups.
        high_throughput = settings.high_throughput_fifo
        self.queue = sqs.Queue(
            self,
            "Queue",
            fifo=True,
            # Identity-based ids from the client (DESIGN.md): content-based dedup would hash the
            # body, which differs between resends (created_at).
            content_based_deduplication=False,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.seconds(constants.QUEUE_RETENTION_S),
            # >= 6 x the function timeout and maxReceiveCount >= 5 for a Lambda event source
            # (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-configure.html,
            # https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html).
            visibility_timeout=Duration.seconds(constants.VISIBILITY_TIMEOUT_S),
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dlq, max_receive_count=settings.max_receive_count
            ),
            deduplication_scope=sqs.DeduplicationScope.MESSAGE_GROUP if high_throughput else None,
            fifo_throughput_limit=(
                sqs.FifoThroughputLimit.PER_MESSAGE_GROUP_ID if high_throughput else None
            ),
            removal_policy=removal,
        )
