"""Fixtures of the trainer client tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues, create_pipeline_queues
from ckpt_pipeline.ops.sqs import sqs_client
from tests.trainer_client.helpers import RestartableMoto


@pytest.fixture
def moto_down(moto_endpoint: str) -> Iterator[tuple[RestartableMoto, PipelineQueues, Any]]:
    """A second moto server on a fixed port with fresh queues, stopped: start() brings it back.

    Depends on ``moto_endpoint`` for the dummy AWS credentials in the environment.
    """
    moto = RestartableMoto()
    moto.start()
    sqs = sqs_client(moto.endpoint)
    queues = create_pipeline_queues(sqs, prefix=f"down{moto.port}")
    moto.stop()
    try:
        yield moto, queues, sqs
    finally:
        moto.stop()
