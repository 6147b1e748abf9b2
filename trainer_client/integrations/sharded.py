"""One rank's part of a sharded checkpoint directory: find it, check it, hand it to the finisher.

Every rank reports the same ``uri``, the ``file://`` URI of the checkpoint directory (what DCP,
Lightning's sharded strategies and DeepSpeed load from), with the files it wrote in
``extra["files"]`` (relative to the directory) and their total size in ``bytes``, once the
reporter's finisher made them durable (``CheckpointReporter.finish``). The
checkpoint is complete once all ``world_size`` ranks reported (docs/DESIGN.md); rank 0 reports
only once the layout's commit marker (DCP's ``.metadata``, DeepSpeed's ``latest``) is there, so a
save that never committed never counts as complete, however many shards are on disk.

Which files are a rank's: ``trainer_client.storage.layouts``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from trainer_client.exceptions import IntegrationError, LayoutError
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.finish.finisher import FinishOutcome
from trainer_client.report._fields import NON_FINITE_FIELD, without_non_finite
from trainer_client.report.reporter import CheckpointReporter
from trainer_client.storage.layouts import missing_files, own_files


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


def finish_rank_files(
    reporter: CheckpointReporter,
    directory: Path,
    files: list[str],
    *,
    step: int,
    epoch: int,
    loss: Any = None,
    framework: str,
    checksums: bool = False,
    post: Sequence[PostStepCall] = (),
) -> Future[FinishOutcome]:
    """Hand this rank's ``files`` of ``directory`` to the reporter's finisher and return.

    The finisher fsyncs them and every directory up to ``directory``'s parent, hashes them with
    ``checksums``, and reports the directory's URI with the files' names (``extra["files"]``, and
    their digests) and total size, off the training thread. The job is on durable disk before
    this returns: a SIGKILL after it is finished (or dropped, if the files changed) at the next
    start. Raises ``FileNotFoundError`` for a file gone already, ``InvalidMessage`` for bad fields.
    """
    # A NaN/infinite loss is recorded as absent (what it was in extra), never loses the save.
    loss, _, non_finite = without_non_finite(loss, {})
    extra: dict[str, Any] = {"framework": framework}
    if non_finite:
        extra[NON_FINITE_FIELD] = non_finite
    return reporter.finish(
        [directory / name for name in files],
        base=directory,
        checksums=checksums,
        list_files=True,
        post=post,
        step=step,
        epoch=epoch,
        uri=directory.resolve().as_uri(),
        loss=loss,
        extra=extra,
    )
