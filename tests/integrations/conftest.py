"""Integration fixtures: the local pipeline (moto's SQS, the real writer, the test database)."""

from __future__ import annotations

# One way to start the pipeline in tests: the end-to-end suite's factory (short timeouts).
from tests.e2e.conftest import pipeline_factory

__all__ = ["pipeline_factory"]
