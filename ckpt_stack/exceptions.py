"""Errors of the stack's settings."""

from __future__ import annotations


class ContextError(ValueError):
    """A CDK context value is missing or breaks a rule: ``.name`` is the key, ``.rule`` the rule."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"context {name!r}: {rule}")
