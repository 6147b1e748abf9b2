"""What the training instances' role needs: one exported managed policy: send to the queue and,
with a checkpoint bucket configured, the client's object actions under its prefix."""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.checkpoint_store import CheckpointStore, suppress_prefix_wildcard
from infra.settings import PipelineSettings


class TrainerAccess(Construct):
    """``policy``: exactly ``sqs:SendMessage`` on the checkpoint queue, and with a checkpoint
    bucket configured, what the client does under its prefix (:mod:`infra.checkpoint_store`).

    ``sqs:SendMessage`` also authorizes SendMessageBatch
    (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-api-permissions-reference.html).
    The client is given the queue URL, so it needs no GetQueueUrl/GetQueueAttributes, and the queue
    uses SQS-managed SSE, so no KMS permission is involved.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        queue: sqs.IQueue,
        store: CheckpointStore | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.policy = iam.ManagedPolicy(
            self,
            "SendPolicy",
            # No name: IAM names are global to the account, so a fixed one would collide with
            # the same stack in a second region; the TrainerPolicyArn output is the interface.
            description="Send checkpoint reports (ckpt.v1) to the checkpoint pipeline queue",
            statements=[
                iam.PolicyStatement(
                    sid="SendCheckpointReports",
                    effect=iam.Effect.ALLOW,
                    actions=["sqs:SendMessage"],
                    resources=[queue.queue_arn],
                ),
                # The checkpoint prefix, when the stack is told of one (infra/checkpoint_store.py).
                *(store.trainer_statements if store is not None else []),
            ],
        )
        if store is not None:
            suppress_prefix_wildcard(self.policy)
