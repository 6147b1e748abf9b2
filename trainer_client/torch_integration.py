"""PyTorch helpers: durable ``torch.save`` and reporting only after an async DCP save succeeded.

The plain loop, with the finishing off the training thread (the loop waits for ``torch.save``
only; fsync, sha256, rename into place and the report follow in the reporter's finisher)::

    from trainer_client.torch_integration import atomic_torch_save_async

    path = f"/mnt/efs/ckpt/step-{step}/rank-{reporter.config.rank}.pt"
    atomic_torch_save_async(reporter, model.state_dict(), path, checksums=True,
                            step=step, epoch=epoch, uri=f"file://{path}", loss=loss)

The same, blocking (every byte fsync'd and hashed before it returns)::

    from trainer_client import CheckpointReporter
    from trainer_client.torch_integration import atomic_torch_save

    with CheckpointReporter(job_id="llama-7b-run3", spool_dir="/mnt/efs/ckpt-spool") as reporter:
        for step, batch in enumerate(loader):
            loss = train_step(batch)
            if step % 1000 == 0:
                path = f"/mnt/efs/ckpt/step-{step}/rank-{reporter.config.rank}.pt"
                size, digest = atomic_torch_save(model.state_dict(), path)  # tmp, fsync, rename
                reporter.report(step=step, epoch=epoch, uri=f"file://{path}", loss=loss,
                                bytes=size, sha256=digest)

With ``torch.distributed.checkpoint.async_save``::

    future = dcp.async_save(state_dict, checkpoint_id=f"/mnt/efs/ckpt/step-{step}")
    report_when_saved(reporter, future, step=step, epoch=epoch, uri=f"file:///mnt/efs/ckpt/step-{step}")
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from ckpt_contract import InvalidMessage
from trainer_client.exceptions import ReporterError
from trainer_client.finish.finisher import FinishOutcome
from trainer_client.report.reporter import CheckpointReporter, ReportFields
from trainer_client.storage.durable import fsync_dir, sha256_file

if TYPE_CHECKING:
    from trainer_client.storage.dcp_s3 import HashedUploads

_log = logging.getLogger(__name__)


class SaveFailures:
    """How many async saves failed (and were therefore never reported), process-wide."""

    _lock = threading.Lock()
    count = 0

    @classmethod
    def add(cls) -> None:
        """Count one failed save."""
        with cls._lock:
            cls.count += 1


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> tuple[int, str]:
    """``torch.save`` to a temp file, fsync, rename into place, fsync the dir; (bytes, sha256)."""
    import torch

    target, tmp = _staging(path)
    try:
        with tmp.open("wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        digest = sha256_file(tmp)
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return size, digest


def atomic_torch_save_async(
    reporter: CheckpointReporter,
    obj: Any,
    path: str | os.PathLike[str],
    *,
    checksums: bool = False,
    **fields: Unpack[ReportFields],
) -> Future[FinishOutcome]:
    """``torch.save`` to a temp file and return; the reporter's finisher fsyncs it, hashes it
    (``checksums``), renames it into place, fsyncs the directory and reports ``fields`` with
    ``bytes`` (and ``sha256``) set.

    The file appears under ``path`` only once durable, as with :func:`atomic_torch_save`; a
    process killed before that leaves the temp file, which the next reporter start on the same
    spool finishes. The training thread pays for ``torch.save`` and one small job record (no fsync).
    """
    import torch

    target, tmp = _staging(path)
    try:
        with tmp.open("wb") as f:
            torch.save(obj, f)
        staged = {str(target): str(tmp)}
        return reporter.finish([target], staged=staged, checksums=checksums, **fields)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _staging(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The target path (its directory created) and a temp file beside it of its own: two saves
    to one path in flight at once must not write into each other's file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return target, target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def completion_future(result: Any) -> Any:
    """The future an async save completes when its files are written (DCP's too)."""
    # torch >= 2.7 may return AsyncSaveResponse(staging_completion, upload_completion); the
    # checkpoint is durable only once the upload (write) completed.
    return getattr(result, "upload_completion", result)


def save_failure(done: Any) -> BaseException | None:
    """The error a completed save future ended with, or None (a cancelled one is a failure)."""
    try:
        if hasattr(done, "exception"):  # concurrent.futures.Future
            return done.exception()  # type: ignore[no-any-return]
        done.value()  # torch.futures.Future: re-raises the save's error
        return None
    except BaseException as exc:  # a cancelled future is a failed save too
        return exc


def report_when_saved(
    reporter: CheckpointReporter,
    save_result: Any,
    *,
    s3_client: Any = None,
    sha256_of: HashedUploads | None = None,
    **fields: Unpack[ReportFields],
) -> None:
    """Report ``fields`` once the ``async_save`` future resolves without error; never otherwise.

    The arguments are validated now (``InvalidMessage`` at the call, as with ``report``); the
    report itself is spooled from the future's callback. A failed save is logged and counted in
    :class:`SaveFailures`, and no report claims it. With ``s3_client`` and an ``s3://`` uri (a DCP
    save through ``s3torchconnector``'s writer), the report pins the objects this rank wrote
    (:mod:`trainer_client.storage.dcp_s3`), read after the save completed, each with its SHA-256
    where ``sha256_of`` (``hash_uploads(writer)``, installed before the save) hashed its upload.
    """
    reporter.prepare(**fields)
    future = completion_future(save_result)
    reporter.save_started()

    def _done(done: Any) -> None:
        try:
            _report_outcome(done)
        finally:
            reporter.save_finished()

    def _report_outcome(done: Any) -> None:
        exc = save_failure(done)
        if exc is not None:
            SaveFailures.add()
            _log.error(
                "[job=%s rank=%s] checkpoint save of step %s failed, not reported: %r",
                reporter.config.job_id,
                reporter.config.rank,
                fields.get("step"),
                exc,
            )
            return
        try:
            pinned: ReportFields = {
                **fields,
                **_pins(s3_client, fields["uri"], reporter.config.rank, sha256_of),  # type: ignore[typeddict-item]
            }
            reporter.report(**pinned)
        except (ReporterError, InvalidMessage, OSError) as error:
            SaveFailures.add()
            _log.error("could not spool the report of step %s: %s", fields.get("step"), error)

    future.add_done_callback(_done)


def _pins(client: Any, uri: str, rank: int, sha256_of: HashedUploads | None) -> dict[str, Any]:
    """``objects``/``bytes`` of this rank's DCP files on S3, or nothing to add."""
    if client is None or not uri.startswith("s3://"):
        return {}
    from trainer_client.storage.dcp_s3 import rank_objects

    try:
        objects = rank_objects(client, uri, rank, sha256_of=sha256_of)
    except Exception as exc:  # botocore's errors: the save succeeded, the pins cannot be read
        _log.warning("could not pin rank %s's DCP files under %s (%r); reported unpinned",
                     rank, uri, exc)  # fmt: skip
        return {}
    if not objects:
        _log.warning("no DCP file of rank %s under %s to pin; reported unpinned", rank, uri)
        return {}
    return {"objects": objects, "bytes": sum(o.bytes for o in objects)}
