"""The writer's errors: transient vs permanent is a type, never a string match."""

from __future__ import annotations


class WriterError(Exception):
    """Root of the writer's errors."""


class SettingsError(WriterError, ValueError):
    """An environment variable is missing or breaks its rule: ``SettingsError(name, rule)``.

    The same shape as the trainer client's ``ReporterConfigError`` and the tooling's
    ``ConfigError``: ``.name`` is the variable, ``.rule`` what it broke; ``str()`` says both.
    """

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class MigrationError(WriterError):
    """A migration file is malformed, or an applied one was edited afterwards."""


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
