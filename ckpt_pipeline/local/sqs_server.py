"""The one place that starts a local SQS emulator and creates the pipeline's queues locally.

Used by the demo, the benchmarks and the test fixtures, so all of them run against queues
configured as the CDK stack configures them (FIFO, explicit dedup ids, FIFO DLQ with redrive).
Two emulators, each in its own process as SQS is remote in production: moto (the light default)
and LocalStack's SQS provider (faithful and fast at depth; :mod:`ckpt_pipeline.local.localstack`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from ckpt_pipeline.local.ports import free_loopback_port
from ckpt_pipeline.ops.sqs import LOCAL_REGION
from lambda_writer.shared import constants

SqsKind = Literal["moto", "localstack"]
SQS_KINDS: tuple[SqsKind, ...] = ("moto", "localstack")


@dataclass(frozen=True)
class PipelineQueues:
    """URLs and ARNs of one main queue and its DLQ."""

    queue_url: str
    queue_arn: str
    dlq_url: str
    dlq_arn: str


def create_pipeline_queues(
    sqs: Any,
    *,
    prefix: str,
    visibility_timeout_s: int = constants.VISIBILITY_TIMEOUT_S,
    max_receive_count: int = constants.MAX_RECEIVE_COUNT,
) -> PipelineQueues:
    """Create (or reuse) ``<prefix>-checkpoints.fifo`` and its FIFO DLQ, configured as deployed."""
    dlq_url = sqs.create_queue(
        QueueName=prefix + constants.DLQ_NAME_SUFFIX,
        Attributes={
            "FifoQueue": "true",
            "ContentBasedDeduplication": "false",
            "MessageRetentionPeriod": str(constants.DLQ_RETENTION_S),
        },
    )["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    queue_url = sqs.create_queue(
        QueueName=prefix + constants.QUEUE_NAME_SUFFIX,
        Attributes={
            "FifoQueue": "true",
            "ContentBasedDeduplication": "false",
            "VisibilityTimeout": str(visibility_timeout_s),
            "MessageRetentionPeriod": str(constants.QUEUE_RETENTION_S),
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}
            ),
        },
    )["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    return PipelineQueues(queue_url, queue_arn, dlq_url, dlq_arn)


def local_aws_env(endpoint_url: str) -> dict[str, str]:
    """boto3 settings for a local endpoint: its URL, plus a region and dummy credentials unless
    the environment already has them (moto accepts any; they keep boto3 from searching). One
    Region in both variables (``AWS_REGION`` first, as the CDK and the operator tools read them:
    ``ckpt_pipeline.aws_region`` refuses two different ones)."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or LOCAL_REGION
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
    }


def set_local_aws_env(endpoint_url: str) -> None:
    """Point boto3 (in this process and its children) at a local endpoint, for good."""
    os.environ.update(local_aws_env(endpoint_url))


@contextmanager
def environ_set(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


# moto_server imports every moto backend before it listens: seconds on a loaded machine.
_MOTO_START_TIMEOUT_S = 60.0


@contextmanager
def moto_sqs_server() -> Iterator[str]:
    """moto's server on a free loopback port, in its own process, for the block; yields its
    endpoint URL.

    Not in-process: moto's request handling would share the caller's GIL with every rank,
    sender and writer thread of a test or benchmark, so under load a send waits behind them past
    the client's read timeout (seen in CI: 32 fan-in ranks timed out against an in-process
    server that answers the same burst in milliseconds from its own process), and moto's CPU
    would be charged to whoever measures.
    """
    with _moto_process() as endpoint:
        yield endpoint


@contextmanager
def _moto_process() -> Iterator[str]:
    port = free_loopback_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + _MOTO_START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {proc.returncode} before listening")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"moto_server: not listening on port {port} after {_MOTO_START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def sqs_emulator(kind: SqsKind = "moto") -> Iterator[str]:
    """The chosen emulator on a free loopback port for the block; yields its endpoint URL."""
    if kind == "moto":
        with moto_sqs_server() as endpoint:
            yield endpoint
    elif kind == "localstack":
        from ckpt_pipeline.local.localstack import localstack_sqs

        with localstack_sqs() as endpoint:
            yield endpoint
    else:
        raise ValueError(f"sqs: unknown emulator {kind!r}; expected one of {', '.join(SQS_KINDS)}")
