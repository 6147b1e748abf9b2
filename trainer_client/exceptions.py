"""Errors of the trainer client; invalid reports raise ``ckpt_contract.InvalidMessage`` instead."""

from __future__ import annotations


class ReporterError(Exception):
    """Root of the trainer client's own errors."""


class ReporterConfigError(ReporterError, ValueError):
    """Missing or invalid configuration, raised at construction; names the argument/env var."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class SpoolLocked(ReporterError):
    """Another live process (or reporter) already owns the spool of this job and rank."""


class SpoolFull(ReporterError):
    """The spool reached its hard bound (max_spool_bytes / max_pending_records); not spooled.

    Only raised after SQS has been unreachable for long enough to fill the bound: dropping the
    report silently or blocking the training step would both be worse than telling the caller.
    """


class ReporterClosed(ReporterError):
    """``report()`` was called after ``close()``."""
