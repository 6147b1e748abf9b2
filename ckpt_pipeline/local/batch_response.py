"""How Lambda's SQS event source reads a function's partial batch response (pure logic).

Rules from https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html
("Success and failure conditions"): an empty or null ``batchItemFailures`` list, or an empty or
null response, is a complete success; an empty-string or null ``itemIdentifier``, a bad key name,
an identifier that is not a message of the batch, or an invalid response is a complete failure.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchOutcome:
    """Which message ids of one batch to delete and which to leave for retry."""

    succeeded: frozenset[str]
    failed: frozenset[str]
    # Why the whole batch counts as failed (exception, timeout, malformed response); else None.
    batch_error: str | None = None

    @property
    def whole_batch_failed(self) -> bool:
        return self.batch_error is not None


def batch_failed(message_ids: Collection[str], reason: str) -> BatchOutcome:
    """Every record of the batch returns to the queue (nothing is deleted)."""
    return BatchOutcome(frozenset(), frozenset(message_ids), reason)


def interpret_response(response: Any, message_ids: Collection[str]) -> BatchOutcome:
    """Apply Lambda's success and failure conditions to a handler's return value."""
    ids = frozenset(message_ids)
    if response is None:
        return BatchOutcome(ids, frozenset())
    if not isinstance(response, dict):
        return batch_failed(ids, f"response is a {type(response).__name__}, not an object")
    failures = response.get("batchItemFailures")
    if failures is None:
        return BatchOutcome(ids, frozenset())
    if not isinstance(failures, list):
        return batch_failed(ids, "batchItemFailures is not a list")
    failed: set[str] = set()
    for item in failures:
        if not isinstance(item, dict) or "itemIdentifier" not in item:
            return batch_failed(ids, f"batchItemFailures entry without itemIdentifier: {item!r}")
        identifier = item["itemIdentifier"]
        if not isinstance(identifier, str) or not identifier:
            return batch_failed(ids, f"itemIdentifier is empty or not a string: {identifier!r}")
        if identifier not in ids:
            return batch_failed(ids, f"itemIdentifier {identifier!r} is not a message of the batch")
        failed.add(identifier)
    return BatchOutcome(ids - failed, frozenset(failed))
