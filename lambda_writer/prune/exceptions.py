"""Errors of retention: a policy that breaks a rule, a prune that could not run."""

from __future__ import annotations

from lambda_writer.shared.exceptions import WriterError


class PolicyError(WriterError, ValueError):
    """A retention policy breaks a rule: ``.name`` is the option (``--keep-last``), ``.rule`` the
    rule. The CDK context's reader renames the option to its context key."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class PruneError(WriterError):
    """The prune could not run (the database changed under it too often, bad input)."""
