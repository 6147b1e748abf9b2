"""The tests' reports: every ckpt.v1 report a test sends is built here, through the contract.

One factory, fields overridable; the packages' helpers (``tests/lambda_writer/helpers.py``,
``tests/ckpt_pipeline/helpers.py``, ``tests/e2e/helpers.py``) pass their own defaults to it.
(The benchmarks have theirs: ``bench/_reports.py``.)
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ckpt_contract import CheckpointReport, encode

# A fixed time, so that a report's body is the same on every run.
CREATED_AT = datetime(2026, 1, 1, tzinfo=UTC)


def report(**overrides: Any) -> CheckpointReport:
    """A valid report of rank 0 of job-a's step 100 (world size 4); any field overridable."""
    fields: dict[str, Any] = {
        "job_id": "job-a", "run_attempt": 0, "step": 100, "epoch": 1, "rank": 0,
        "world_size": 4, "uri": "s3://bucket/job-a/step-100/rank-0.pt", "loss": 0.5,
        "metrics": {"acc": 0.9}, "created_at": CREATED_AT,
    }  # fmt: skip
    return CheckpointReport.create(**(fields | overrides))


def body(**overrides: Any) -> str:
    """The encoded body of :func:`report`."""
    return encode(report(**overrides))
