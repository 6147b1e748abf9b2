"""Errors of checkpoint storage, under the client's root ``ReporterError``."""

from __future__ import annotations

from typing import Any

from trainer_client.exceptions import ReporterError


def client_error_text(exc: Any) -> str:
    """A botocore ``ClientError`` as S3's code and message ("AccessDenied Access Denied"), the
    message left out where S3 sent none: the cause the storage errors below quote."""
    error = exc.response.get("Error", {})
    return f"{error.get('Code')} {error.get('Message') or ''}".rstrip()


class StorageError(ReporterError):
    """Root of the storage errors: the bytes could not be stored or their state not learned."""


class UploadError(StorageError):
    """An object was not stored as the file was (or the store refused it): nothing to report."""

    def __init__(self, uri: str, rule: str) -> None:
        self.uri = uri
        self.rule = rule
        super().__init__(f"{uri}: {rule}")


class VerifyError(StorageError):
    """The store could not be asked (permission, network, unknown scheme): nothing was decided.
    ``name`` is the argument or field, ``rule`` the cause."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class RestoreError(StorageError):
    """A restore could not complete: an object differs from its report, or the store refused.
    ``name`` is the argument or field, ``rule`` the cause."""

    def __init__(self, name: str, rule: str) -> None:
        self.name = name
        self.rule = rule
        super().__init__(f"{name}: {rule}")


class ListingRefused(Exception):
    """The store refused a listing of ``bucket`` (no ``s3:ListBucket``): HEAD instead."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        super().__init__(bucket)
