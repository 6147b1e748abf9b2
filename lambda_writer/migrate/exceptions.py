"""Errors of the migrations."""

from __future__ import annotations

from lambda_writer.shared.exceptions import WriterError


class MigrationError(WriterError):
    """A migration file is malformed, or an applied one was edited afterwards."""


class ChannelBindingRefused(WriterError):
    """The server offered no SCRAM-SHA-256-PLUS login: an md5 password, or not the database."""


class LoginRefused(WriterError):
    """The database refused the migration's login (wrong password, md5 under SCRAM, pg_hba)."""
