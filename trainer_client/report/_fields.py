"""The arguments of ``report()``: their names, and numbers as the contract takes them."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict

from ckpt_contract import FieldError, InvalidMessage, StoredObject


class ReportFields(TypedDict):
    """The arguments of ``prepare()``/``report()``, declared once so mypy checks every call.

    Fields the contract does not know go through ``extra`` only: a misspelled keyword is an
    error, never a silently stored extra field.
    """

    step: int
    epoch: int
    uri: str
    loss: NotRequired[Any]
    metrics: NotRequired[Mapping[str, Any] | None]
    bytes: NotRequired[int | None]
    sha256: NotRequired[str | None]
    # Pins of the stored objects (ckpt_contract.StoredObject or its fields as a mapping).
    objects: NotRequired[Sequence[StoredObject | Mapping[str, Any]] | None]
    extra: NotRequired[Mapping[str, Any] | None]


REPORT_FIELDS = frozenset(ReportFields.__annotations__)
# Spelled out: with postponed annotations, Python 3.11 cannot see NotRequired in
# __required_keys__.
REQUIRED_FIELDS = frozenset({"step", "epoch", "uri"})


def number(value: Any) -> Any:
    """A 0-d tensor / numpy scalar / int as a Python float; anything else is left to validation."""
    if type(value) is float:
        # The common case, first: the hasattr() below raises and swallows an AttributeError
        # for a float, which costs ~5 us per metric on report()'s path.
        return value
    if isinstance(value, bool) or value is None:
        return value
    if hasattr(value, "item") and not isinstance(value, float | int):
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool | float):
        return float(value)
    return value


# The extra field that keeps what a non-finite loss or metric was:
# {"loss": "nan", "metrics.acc": "inf"}.
NON_FINITE_FIELD = "non_finite"


def _non_finite(value: Any) -> str | None:
    value = number(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return None


def without_non_finite(
    loss: Any, metrics: Mapping[str, Any]
) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """``loss`` and ``metrics`` with each NaN/infinite number left out, and what those were.

    The contract refuses a non-finite number, rightly (JSON has none, and a NaN would sort as
    the best value); a checkpoint must not be lost over one. So the value is recorded as absent
    (NULL: never the best checkpoint) and the fact kept in the report's extra field
    :data:`NON_FINITE_FIELD` (``{"loss": "nan", "metrics.acc": "inf"}``), where a reader of the
    shard row sees it.
    """
    found: dict[str, str] = {}
    if (text := _non_finite(loss)) is not None:
        found["loss"], loss = text, None
    kept: dict[str, Any] = {}
    for name, value in metrics.items():
        if (text := _non_finite(value)) is not None:
            found[f"metrics.{name}"] = text
        else:
            kept[name] = value
    return loss, kept, found


def integer(value: Any) -> Any:
    """A numpy integer / integer 0-d tensor as a Python int; anything else unchanged."""
    if isinstance(value, bool | int) or not hasattr(value, "__index__"):
        return value
    return operator.index(value)


def check_arguments(fields: Mapping[str, Any]) -> None:
    # Unpack[ReportFields] is checked by mypy, not at run time: check the names here.
    names = fields.keys()
    if names <= REPORT_FIELDS and names >= REQUIRED_FIELDS:
        return
    unknown = sorted(set(fields) - REPORT_FIELDS)
    missing = sorted(REQUIRED_FIELDS - set(fields))
    errors = [
        FieldError(name, "unknown argument (extra fields go in extra={...})") for name in unknown
    ] + [FieldError(name, "is required") for name in missing]
    if errors:
        raise InvalidMessage(errors)


def objects_field(value: Any) -> dict[str, Any]:
    """``objects=`` for the contract: left out when absent (the body stays as it was), a list."""
    if value is None:
        return {}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return {"objects": list(value)}
    return {"objects": value}  # refused by validation, naming the field
