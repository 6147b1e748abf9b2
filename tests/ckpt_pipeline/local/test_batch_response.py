"""Lambda's success and failure conditions for a partial batch response (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_pipeline.local.batch_response import interpret_response

IDS = ["m1", "m2", "m3"]


@pytest.mark.parametrize(
    "response",
    [None, {}, {"batchItemFailures": []}, {"batchItemFailures": None}],
)
def test_complete_success(response: Any) -> None:
    outcome = interpret_response(response, IDS)
    assert outcome.succeeded == frozenset(IDS)
    assert not outcome.failed
    assert not outcome.whole_batch_failed


def test_partial_failure_deletes_the_rest() -> None:
    outcome = interpret_response({"batchItemFailures": [{"itemIdentifier": "m2"}]}, IDS)
    assert outcome.succeeded == {"m1", "m3"}
    assert outcome.failed == {"m2"}


@pytest.mark.parametrize(
    "response",
    [
        "ok",
        ["m1"],
        {"batchItemFailures": "m1"},
        {"batchItemFailures": [{"itemIdentifier": ""}]},
        {"batchItemFailures": [{"itemIdentifier": None}]},
        {"batchItemFailures": [{"messageId": "m1"}]},
        {"batchItemFailures": [{"itemIdentifier": "not-in-batch"}]},
        {"batchItemFailures": ["m1"]},
    ],
)
def test_malformed_response_fails_the_whole_batch(response: Any) -> None:
    outcome = interpret_response(response, IDS)
    assert outcome.whole_batch_failed
    assert outcome.failed == frozenset(IDS)
    assert not outcome.succeeded
