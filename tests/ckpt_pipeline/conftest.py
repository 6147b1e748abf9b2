"""Fixtures of the operator tooling's tests: queues that retry fast."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ckpt_pipeline.local_sqs import PipelineQueues, create_pipeline_queues


@pytest.fixture
def fast_queues(sqs: Any) -> PipelineQueues:
    """A fresh FIFO queue + DLQ with a 1 s visibility timeout and maxReceiveCount 3."""
    return create_pipeline_queues(
        sqs, prefix=f"f{uuid.uuid4().hex[:10]}", visibility_timeout_s=1, max_receive_count=3
    )
