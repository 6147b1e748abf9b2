"""Errors of the message contract; every rejection names the field and the rule it broke."""

from __future__ import annotations

from dataclasses import dataclass


class ContractError(Exception):
    """Root of the contract's errors."""


@dataclass(frozen=True)
class FieldError:
    """One broken rule: ``field`` is a dotted path (``metrics.acc``) or ``<body>`` for the whole."""

    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


class InvalidMessage(ContractError, ValueError):
    """A report or message body that breaks the ``ckpt.v1`` contract; it can never be written."""

    def __init__(
        self, errors: list[FieldError] | tuple[FieldError, ...], *, schema: str = "ckpt.v1"
    ) -> None:
        self.errors: tuple[FieldError, ...] = tuple(errors)
        super().__init__(f"invalid {schema} message: " + "; ".join(str(e) for e in self.errors))

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of the offending fields, in order."""
        return tuple(e.field for e in self.errors)


class MessageTooLarge(InvalidMessage):
    """The encoded message exceeds the contract's size limit."""
