"""``status`` while the database is down: what it can reach is shown, what it cannot is one line.

moto's SQS (the pipeline's FIFO queue and DLQ, created as the stack creates them) and moto's
Lambda (the writer's event source mapping, which the breaker disables), a database URL whose
port nothing listens on, the CLI's own code path (``main(argv, env)``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.receive_gate import LocalMapping, create_local_mapping
from ckpt_pipeline.local.sqs_server import PipelineQueues

DOWN = "postgresql://postgres@127.0.0.1:9/ckpt"


@pytest.fixture
def mapping(moto_endpoint: str) -> Iterator[LocalMapping]:
    session = boto3.session.Session()
    yield create_local_mapping(
        session.client("lambda", endpoint_url=moto_endpoint),
        session.client("sqs", endpoint_url=moto_endpoint),
        session.client("iam", endpoint_url=moto_endpoint),
        prefix=f"s{uuid.uuid4().hex[:8]}",
    )


def _send(sqs: Any, url: str, count: int) -> None:
    for i in range(count):
        sqs.send_message(
            QueueUrl=url, MessageBody="{}", MessageGroupId="g", MessageDeduplicationId=f"d{i}"
        )


def test_status_shows_the_queues_and_the_breaker_while_the_database_is_down(
    sqs: Any,
    pipeline_queues: PipelineQueues,
    mapping: LocalMapping,
    moto_endpoint: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN the database down, the breaker open (the writer's mapping disabled), 3 reports
    # waiting in the queue and 1 in the DLQ
    boto3.client("lambda", endpoint_url=moto_endpoint).update_event_source_mapping(
        UUID=mapping.uuid, Enabled=False
    )
    _send(sqs, pipeline_queues.queue_url, 3)
    _send(sqs, pipeline_queues.dlq_url, 1)
    env = {
        **os.environ,
        "DATABASE_URL": DOWN,
        "CKPT_QUEUE_URL": pipeline_queues.queue_url,
        "DLQ_URL": pipeline_queues.dlq_url,
        "EVENT_SOURCE_MAPPING_ID": mapping.uuid,
    }
    # WHEN an operator asks for the status
    code = main(["status"], env)
    out, err = capsys.readouterr()
    # THEN the depths and the breaker are shown, and the one thing it could not read is one line
    assert code == 1
    assert out.splitlines() == [
        "checkpoints per job: not shown, the database cannot be read (stderr)",
        "queue: 3 visible, 0 in flight, 0 delayed",
        "DLQ: 1 visible, 0 in flight, 0 delayed",
        "breaker: open: the writer's mapping is Disabled, reports wait in the queue",
    ]
    (line,) = err.splitlines()
    assert line.startswith("ckpt-pipeline status: PostgreSQL (DATABASE_URL): cannot connect: ")
    # AND the same for scripts
    assert main(["status", "--json"], env) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["jobs"] is None and doc["queue"]["total"] == 3 and doc["dlq"]["total"] == 1
    assert doc["mapping_state"] == "Disabled" and doc["errors"] == [line.split(": ", 1)[1]]


def test_status_with_nothing_else_to_show_still_says_only_what_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Without queue URLs or a mapping there is nothing but the database to show: one line, exit 1
    unset = ("CKPT_QUEUE_URL", "DLQ_URL", "EVENT_SOURCE_MAPPING_ID")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    assert main(["status"], {**env, "DATABASE_URL": DOWN}) == 1
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("ckpt-pipeline status: PostgreSQL (DATABASE_URL): cannot connect: ")
