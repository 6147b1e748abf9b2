"""Errors of the operator tooling: configuration, the local event source, the embedded database."""

from __future__ import annotations


class PipelineError(Exception):
    """Root of the operator tooling's errors."""


class ConfigError(PipelineError, ValueError):
    """A setting is missing or breaks a rule; names the variable (or option) and the rule."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class EmbeddedPostgresError(PipelineError):
    """No usable PostgreSQL: none configured, none reachable, and no binaries to start one."""


class ReplayError(PipelineError):
    """The DLQ replay could not start (bad queue, unreadable DLQ)."""


class ReconcileError(PipelineError):
    """The reconciliation could not finish (a report refused by SQS, a store that cannot answer)."""


class DatabaseNotReady(PipelineError):
    """The database cannot be reached, or its schema is not the one this writer needs."""


class LocalStackUnavailable(RuntimeError):
    """LocalStack is not installed, or did not become healthy."""
