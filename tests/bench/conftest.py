"""The benches run here in the pytest worker's process, and some point boto3's environment at
their own servers (``bench._harness.helpers_s3`` sets ``AWS_ENDPOINT_URL``, as a job's helpers
read it): each test gets the environment back as it was, so no later test in the same worker
sends to a server that has stopped."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
