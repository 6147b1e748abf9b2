"""Fixtures of the operator tooling's tests: queues that retry fast."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ckpt_pipeline.local.event_source import Handler
from ckpt_pipeline.local.sqs_server import PipelineQueues, create_pipeline_queues


@pytest.fixture
def fast_queues(sqs: Any) -> PipelineQueues:
    """A fresh FIFO queue + DLQ with a 1 s visibility timeout and maxReceiveCount 3."""
    return create_pipeline_queues(
        sqs, prefix=f"f{uuid.uuid4().hex[:10]}", visibility_timeout_s=1, max_receive_count=3
    )


@pytest.fixture
def real_writer(
    clean_db: str, fast_queues: PipelineQueues, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Handler]:
    """``lambda_writer.handler.handler`` configured for ``clean_db`` and ``fast_queues``' DLQ."""
    from lambda_writer import handler as lambda_handler

    monkeypatch.setenv("DATABASE_URL", clean_db)
    monkeypatch.setenv("DLQ_URL", fast_queues.dlq_url)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    # The handler reads its settings once per process (one execution environment): start a new
    # environment for this test's database and DLQ, and close its connection afterwards.
    lambda_handler.get_writer.cache_clear()
    yield lambda_handler.handler
    lambda_handler.get_writer().connection.discard()
    lambda_handler.get_writer.cache_clear()
