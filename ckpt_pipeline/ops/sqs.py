"""SQS (and Lambda) as the operator tools see them: clients from boto3's configuration, depths,
ARNs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import boto3

from ckpt_pipeline.aws_region import resolve_region

# boto3 needs a region to build a client; used only when its own resolution finds none.
LOCAL_REGION = "us-east-1"


def sqs_client(endpoint_url: str | None = None) -> Any:
    """A boto3 SQS client; ``endpoint_url`` defaults to boto3's config (``AWS_ENDPOINT_URL``)."""
    # The Region cdk deploy uses (AWS_REGION, then boto3's own resolution: AWS_DEFAULT_REGION,
    # the profile); the local default only when there is none.
    region = resolve_region() or LOCAL_REGION
    return boto3.client("sqs", endpoint_url=endpoint_url, region_name=region)


def lambda_client() -> Any:
    """A boto3 Lambda client from boto3's configuration (``status`` reads the writer's mapping)."""
    region = boto3.session.Session().region_name or LOCAL_REGION
    return boto3.client("lambda", region_name=region)


@dataclass(frozen=True)
class QueueDepth:
    """SQS's approximate message counts of one queue."""

    visible: int
    in_flight: int
    delayed: int

    @property
    def total(self) -> int:
        return self.visible + self.in_flight + self.delayed


def queue_depth(sqs: Any, queue_url: str) -> QueueDepth:
    """Visible, in-flight and delayed message counts (GetQueueAttributes)."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return QueueDepth(
        visible=int(attributes.get("ApproximateNumberOfMessages", 0)),
        in_flight=int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
        delayed=int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
    )


def queue_arn_of(sqs: Any, queue_url: str) -> str:
    """The ARN of a queue given its URL."""
    return str(
        sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
    )
