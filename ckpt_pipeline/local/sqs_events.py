"""Lambda's SQS event shape, built from what ``ReceiveMessage`` returned.

One place for the shape, so that the local event source and the tests hand the real handler
exactly what Lambda's SQS event source would
(https://docs.aws.amazon.com/lambda/latest/dg/with-sqs.html#example-standard-queue-message-event).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any


def _message_attribute(value: Mapping[str, Any]) -> dict[str, Any]:
    # AWS's records carry stringValue or binaryValue, whichever the attribute has.
    record: dict[str, Any] = {}
    if "StringValue" in value:
        record["stringValue"] = value["StringValue"]
    if "BinaryValue" in value:
        record["binaryValue"] = base64.b64encode(value["BinaryValue"]).decode()
    return record | {
        "stringListValues": list(value.get("StringListValues", [])),
        "binaryListValues": [
            base64.b64encode(b).decode() for b in value.get("BinaryListValues", [])
        ],
        "dataType": value["DataType"],
    }


def sqs_record(message: Mapping[str, Any], *, queue_arn: str) -> dict[str, Any]:
    """One event record from one boto3 ``ReceiveMessage`` message (asked with attributes "All")."""
    region = queue_arn.split(":")[3]
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes", {})),
        "messageAttributes": {
            name: _message_attribute(value)
            for name, value in message.get("MessageAttributes", {}).items()
        },
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }


def sqs_event(messages: Iterable[Mapping[str, Any]], *, queue_arn: str) -> dict[str, Any]:
    """The ``{"Records": [...]}`` event Lambda's SQS event source passes to the function."""
    return {"Records": [sqs_record(m, queue_arn=queue_arn) for m in messages]}


def receive_kwargs(
    *, max_messages: int, wait_time_s: int, visibility_timeout_s: int | None
) -> dict[str, Any]:
    """``ReceiveMessage`` arguments that return everything an event record carries."""
    kwargs: dict[str, Any] = {
        "MaxNumberOfMessages": max_messages,
        "WaitTimeSeconds": wait_time_s,
        "MessageSystemAttributeNames": ["All"],
        "MessageAttributeNames": ["All"],
    }
    if visibility_timeout_s is not None:
        kwargs["VisibilityTimeout"] = visibility_timeout_s
    return kwargs
