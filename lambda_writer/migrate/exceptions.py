"""Errors of the migrations."""

from __future__ import annotations

from lambda_writer.shared.exceptions import WriterError


class MigrationError(WriterError):
    """A migration file is malformed, or an applied one was edited afterwards."""
