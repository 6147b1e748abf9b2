"""One rank's part of a sharded checkpoint directory: find it, check it, make it durable, report it.

Every rank reports the same ``uri``, the ``file://`` URI of the checkpoint directory (what DCP,
Lightning's sharded strategies and DeepSpeed load from), with the files it wrote in
``extra["files"]`` (relative to the directory) and their total size in ``bytes``. The
checkpoint is complete once all ``world_size`` ranks reported (docs/DESIGN.md); rank 0 reports
only once the layout's commit marker (DCP's ``.metadata``, DeepSpeed's ``latest``) is there, so a
save that never committed never counts as complete, however many shards are on disk.

Which files are a rank's: ``trainer_client.integrations._layouts``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ckpt_contract import MessageTooLarge
from trainer_client.integrations._layouts import LayoutError, missing_files, own_files
from trainer_client.integrations.exceptions import IntegrationError
from trainer_client.reporter import CheckpointReporter

_log = logging.getLogger(__name__)
_CHUNK = 4 * 1024 * 1024


def list_files(directory: Path) -> list[str]:
    """Every file under ``directory``, relative to it, in POSIX form."""
    found = []
    for root, _dirs, names in os.walk(directory):
        for name in names:
            found.append((Path(root) / name).relative_to(directory).as_posix())
    return sorted(found)


def rank_files(
    directory: Path,
    *,
    rank: int,
    saves_shared: bool,
    required: Iterable[str] = (),
) -> list[str]:
    """This rank's files of the checkpoint ``directory``, checked complete for its layout.

    ``required``: further files this rank must have written (Lightning's ``meta.pt`` on rank 0).
    Raises ``IntegrationError`` naming what is missing, or a file no rank can be named for.
    """
    if not directory.is_dir():
        raise IntegrationError("checkpoint", f"{directory} is not a directory")
    present = list_files(directory)
    try:
        mine = own_files(present, rank=rank, saves_shared=saves_shared)
        missing = missing_files(present, rank=rank)
    except LayoutError as exc:
        raise IntegrationError("checkpoint", str(exc)) from None
    missing += [name for name in required if name not in present]
    if missing:
        raise IntegrationError(
            "checkpoint", f"{directory} lacks {', '.join(missing)}, which rank {rank} needs"
        )
    if not mine:
        raise IntegrationError("checkpoint", f"{directory} holds no file of rank {rank}")
    return mine


def make_durable(directory: Path, files: Iterable[str]) -> int:
    """fsync each file, then every directory from the files' up to ``directory``'s parent (the
    entries that name them); returns the files' total size."""
    total = 0
    directories = {directory, directory.parent}
    for relative in files:
        path = directory / relative
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
        parent = path.parent
        while parent != directory and directory in parent.parents:
            directories.add(parent)
            parent = parent.parent
    for path in sorted(directories, key=lambda p: len(p.parts), reverse=True):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return total


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def report_rank_files(
    reporter: CheckpointReporter,
    directory: Path,
    files: list[str],
    *,
    step: int,
    epoch: int,
    loss: Any = None,
    framework: str,
    checksums: bool = False,
) -> None:
    """Make ``files`` durable (and hash them), then report them as this rank's part."""
    size = make_durable(directory, files)
    extra: dict[str, Any] = {"framework": framework, "files": files}
    sha256 = None
    if checksums:
        digests = {name: _sha256(directory / name) for name in files}
        extra["file_sha256"] = digests
        if len(files) == 1:
            sha256 = digests[files[0]]
    fields: dict[str, Any] = {
        "step": step,
        "epoch": epoch,
        "uri": directory.resolve().as_uri(),
        "loss": loss,
        "bytes": size,
        "sha256": sha256,
    }
    try:
        reporter.report(**fields, extra=extra)
    except MessageTooLarge:
        # Thousands of shard files: the list would not fit the contract's 64 KiB body.
        reporter.report(**fields, extra={"framework": framework, "file_count": len(files)})
