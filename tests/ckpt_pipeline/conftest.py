"""Fixtures of the operator tooling's tests: queues that retry fast."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ckpt_pipeline.local.event_source import EventHandler
from ckpt_pipeline.local.sqs_server import PipelineQueues, create_pipeline_queues


@pytest.fixture
def fast_queues(sqs: Any) -> PipelineQueues:
    """A fresh FIFO queue + DLQ with a 1 s visibility timeout and maxReceiveCount 3."""
    return create_pipeline_queues(
        sqs, prefix=f"f{uuid.uuid4().hex[:10]}", visibility_timeout_s=1, max_receive_count=3
    )


@pytest.fixture
def real_writer(clean_db: str, fast_queues: PipelineQueues) -> Iterator[EventHandler]:
    """One execution environment of the real writer for ``clean_db`` and ``fast_queues``' DLQ
    (its connection closed afterwards)."""
    from lambda_writer import WriterSettings, make_handler

    settings = WriterSettings(database_url=clean_db, dlq_url=fast_queues.dlq_url)
    handler = make_handler(settings, emit_metrics=False)
    yield handler
    handler.close()


@pytest.fixture
def cli_env(clean_db: str, fast_queues: PipelineQueues) -> dict[str, str]:
    """The CLI's environment (``main(argv, env)``): this process's, with ``clean_db`` and
    ``fast_queues``' DLQ for the commands and poll's writer."""
    return {**os.environ, "DATABASE_URL": clean_db, "DLQ_URL": fast_queues.dlq_url}
