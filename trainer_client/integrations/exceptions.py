"""Errors of the framework integrations, under the client's root ``ReporterError``."""

from __future__ import annotations

from trainer_client.exceptions import ReporterError


class IntegrationError(ReporterError):
    """Root of the integrations' errors; ``name`` is the argument/setting, ``rule`` the cause."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class ExtraMissing(IntegrationError):
    """An integration needs a package the base install does not have; names the extra.

    Not an ``ImportError``: that type's own ``name`` attribute (the module) would clash.
    """


class ResumeError(IntegrationError):
    """The database could not answer which checkpoint to resume from (bad input, unreachable,
    not migrated, or stored URIs that name no common checkpoint location)."""


class LayoutError(ValueError):
    """A file the layout rules (``_layouts``) cannot attribute to exactly one rank (model
    parallelism, a layout they do not know): the checkpoint is not reported rather than reported
    wrongly."""
