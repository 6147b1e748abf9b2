"""Errors of the circuit breaker."""

from __future__ import annotations

from lambda_writer.shared.exceptions import WriterError


class BreakerError(WriterError):
    """The mapping could not be read or switched (the breaker function then fails loudly)."""
