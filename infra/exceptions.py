"""Errors raised while building the CDK app (before anything reaches CloudFormation)."""

from __future__ import annotations


class InfraError(Exception):
    """Root of the CDK app's errors."""


class SettingsError(InfraError):
    """A context value is missing or breaks a rule: ``.name`` is the key, ``.rule`` the rule."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"context {name!r}: {rule}")


class BundlingError(InfraError):
    """The Lambda bundle could not be built or failed its own checks."""
