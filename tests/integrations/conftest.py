"""Integration fixtures: the local pipeline (moto's SQS, the real writer, the test database)."""

from __future__ import annotations

from tests.e2e.conftest import pipeline_factory
from tests.integrations.deepspeed_ops import deepspeed_ops

# One way to start the pipeline in tests: the end-to-end suite's factory (short timeouts).
__all__ = ["deepspeed_ops", "pipeline_factory"]
