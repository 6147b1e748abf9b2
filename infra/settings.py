"""The stack's settings: the CDK context parsed by ``ckpt_stack.context`` (the one
definition of its keys and rules, which ``ckpt-pipeline preflight`` reads too), with a bad value
raised as this package's :class:`SettingsError`."""

from __future__ import annotations

from collections.abc import Iterable

from ckpt_stack.context import ContextGetter, parse_context
from ckpt_stack.exceptions import ContextError
from ckpt_stack.settings import (
    CheckpointStoreSettings,
    ExistingDatabase,
    ExistingNetwork,
    NewDatabase,
    PipelineSettings,
    ScheduledPrune,
)
from infra.exceptions import SettingsError

__all__ = [
    "CheckpointStoreSettings",
    "ContextGetter",
    "ExistingDatabase",
    "ExistingNetwork",
    "NewDatabase",
    "PipelineSettings",
    "ScheduledPrune",
    "load_settings",
]


def load_settings(get: ContextGetter, keys: Iterable[str] | None = None) -> PipelineSettings:
    """Validate the context once; raises :class:`SettingsError` naming the key and the rule.

    ``keys``: every key of the context, so that an unknown one is refused (a typo would
    otherwise synthesize the default)."""
    try:
        return parse_context(get, keys)
    except ContextError as exc:
        raise SettingsError(exc.name, exc.rule) from None
