"""Checkpoint paths and URIs for the integrations (no framework imports)."""

from __future__ import annotations

import os
from pathlib import Path

from trainer_client.storage.uri import CheckpointUri


def is_local(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is on a local (or mounted: EFS, NFS) file system, not an object store."""
    text = os.fspath(path)
    return "://" not in text or text.startswith("file://")


def local_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a local absolute path (a ``file://`` URI decoded)."""
    text = os.fspath(path)
    if text.startswith("file://"):
        text = CheckpointUri.parse(text).decoded_path
    return Path(text).resolve()


def checkpoint_uri(path: str | os.PathLike[str]) -> str:
    """The URI a report carries: ``file://`` + absolute path locally, the URL itself otherwise."""
    return local_path(path).as_uri() if is_local(path) else os.fspath(path)
