"""PyTorch helpers: durable ``torch.save`` and reporting only after an async DCP save succeeded.

The plain loop::

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

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any, Unpack

from ckpt_contract import InvalidMessage
from trainer_client.exceptions import ReporterError
from trainer_client.reporter import CheckpointReporter, ReportFields

_log = logging.getLogger(__name__)
_CHUNK = 4 * 1024 * 1024


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

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        digest = hashlib.sha256()
        size = 0
        with tmp.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return size, digest.hexdigest()


def _completion_future(result: Any) -> Any:
    # torch >= 2.7 may return AsyncSaveResponse(staging_completion, upload_completion); the
    # checkpoint is durable only once the upload (write) completed.
    return getattr(result, "upload_completion", result)


def _failure(done: Any) -> BaseException | None:
    try:
        if hasattr(done, "exception"):  # concurrent.futures.Future
            return done.exception()  # type: ignore[no-any-return]
        done.value()  # torch.futures.Future: re-raises the save's error
        return None
    except BaseException as exc:  # a cancelled future is a failed save too
        return exc


def report_when_saved(
    reporter: CheckpointReporter, save_result: Any, **fields: Unpack[ReportFields]
) -> None:
    """Report ``fields`` once the ``async_save`` future resolves without error; never otherwise.

    The arguments are validated now (``InvalidMessage`` at the call, as with ``report``); the
    report itself is spooled from the future's callback. A failed save is logged and counted in
    :class:`SaveFailures`, and no report claims it.
    """
    reporter.prepare(**fields)
    future = _completion_future(save_result)
    reporter.save_started()

    def _done(done: Any) -> None:
        try:
            _report_outcome(done)
        finally:
            reporter.save_finished()

    def _report_outcome(done: Any) -> None:
        exc = _failure(done)
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
            reporter.report(**fields)
        except (ReporterError, InvalidMessage, OSError) as error:
            SaveFailures.add()
            _log.error("could not spool the report of step %s: %s", fields.get("step"), error)

    future.add_done_callback(_done)
