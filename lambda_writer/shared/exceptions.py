"""Errors every function shares: the root, a bad setting, a transient database failure.

Transient vs permanent is a type, never a string match (the writer's own are in
``lambda_writer.writer.exceptions``)."""

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


class TransientWriteError(WriterError):
    """The batch's transaction failed for a reason that a later retry can fix (DB down, timeout,
    deadlock, serialization failure, dropped connection); nothing of the batch was committed."""
