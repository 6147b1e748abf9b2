"""Errors of the writer function: a record, or a batch's data, that can never be written."""

from __future__ import annotations

from lambda_writer.shared.exceptions import WriterError


class PoisonRecord(WriterError):
    """One SQS record that can never be written (undecodable, invalid, unknown schema)."""

    def __init__(self, error_class: str, message: str) -> None:
        self.error_class = error_class
        super().__init__(message)


class PermanentWriteError(PoisonRecord):
    """The database rejects the batch's data itself (constraint or data error): retrying the same
    rows can never succeed, so the offending record must be isolated and sent to the DLQ."""


class MalformedEvent(WriterError, ValueError):
    """The event is not an SQS event (no messageId to report): the whole invocation fails."""
