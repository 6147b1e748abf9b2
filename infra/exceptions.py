"""Errors raised while building the CDK app (before anything reaches CloudFormation)."""

from __future__ import annotations


class InfraError(Exception):
    """Root of the CDK app's errors."""


class SettingsError(InfraError):
    """A context value is missing or breaks a rule; names the context key and the rule."""

    def __init__(self, key: str, rule: str) -> None:
        self.key = key
        self.rule = rule
        super().__init__(f"context {key!r}: {rule}")


class BundlingError(InfraError):
    """The Lambda bundle could not be built or failed its own checks."""
