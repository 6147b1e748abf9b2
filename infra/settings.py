"""The stack's settings: the CDK context parsed by ``ckpt_contract.stack_context`` (the one
definition of its keys and rules, which ``ckpt-pipeline preflight`` reads too), with a bad value
raised as this package's :class:`SettingsError`."""

from __future__ import annotations

from ckpt_contract.exceptions import ContextError
from ckpt_contract.stack_context import (
    CheckpointStore,
    ContextGetter,
    ExistingDatabase,
    ExistingNetwork,
    NewDatabase,
    PipelineSettings,
    ScheduledPrune,
    parse_context,
)
from infra.exceptions import SettingsError

__all__ = [
    "CheckpointStore",
    "ContextGetter",
    "ExistingDatabase",
    "ExistingNetwork",
    "NewDatabase",
    "PipelineSettings",
    "ScheduledPrune",
    "load_settings",
]


def load_settings(get: ContextGetter) -> PipelineSettings:
    """Validate the context once; raises :class:`SettingsError` naming the key and the rule."""
    try:
        return parse_context(get)
    except ContextError as exc:
        raise SettingsError(exc.name, exc.rule) from None
