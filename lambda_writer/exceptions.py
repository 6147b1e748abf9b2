"""The writer's errors: transient vs permanent is a type, never a string match."""

from __future__ import annotations


class WriterError(Exception):
    """Root of the writer's errors."""


class SettingsError(WriterError, ValueError):
    """An environment variable is missing or breaks its rule; the message names both."""


class TransientWriteError(WriterError):
    """The batch's transaction failed for a reason that a later retry can fix (DB down, timeout,
    deadlock, serialization failure, dropped connection); nothing of the batch was committed."""


class PoisonRecord(WriterError):
    """One SQS record that can never be written (undecodable, invalid, unknown schema)."""

    def __init__(self, error_class: str, message: str) -> None:
        self.error_class = error_class
        super().__init__(message)


class PermanentWriteError(PoisonRecord):
    """The database rejects the batch's data itself (constraint or data error): retrying the same
    rows can never succeed, so the offending record must be isolated and sent to the DLQ."""
