"""The save path of the Lightning callback: which rank reports which save, and when.

:class:`LightningSaves` is the half of ``CheckpointReporting`` (``trainer_client.integrations
.lightning``, whose docstring states the rules) that follows one save from the trainer's
``save_checkpoint`` to a report: rank 0's file through ``ReportingCheckpointIO`` once written,
the other ranks' report of the same file once it exists at its final path (at once, or from a
watcher thread for an asynchronous write), each rank's own files of a sharded save after its
barrier, and the bookkeeping that lets ``close()`` wait for the saves still open. The callback
keeps Lightning's hooks and the reporter's lifecycle.
"""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH

from ckpt_contract import InvalidMessage
from trainer_client.exceptions import IntegrationError, ReporterError
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.finish.finisher import FinishOutcome
from trainer_client.integrations._lightning_layout import SaveLayout, rank0_required
from trainer_client.integrations._loss_watch import LossWatch
from trainer_client.integrations._paths import checkpoint_uri, is_local, local_path
from trainer_client.integrations._upload import waiting
from trainer_client.integrations.sharded import finish_rank_files, rank_files
from trainer_client.report._fields import NON_FINITE_FIELD, without_non_finite
from trainer_client.report.reporter import CheckpointReporter

# The callback's user-facing logger (see lightning.py): the same name, so the same logger.
_user_log = logging.getLogger("lightning.pytorch.ckpt_reporter")


class LightningSaves:
    """The save path (see the module); ``CheckpointReporting`` sets these attributes."""

    reporter: CheckpointReporter | None
    loss_metric: str | None
    checksums: bool
    wait_for_file_s: float
    _post: tuple[PostStepCall, ...]
    _trainer: pl.Trainer | None
    _lock: threading.Lock | None
    _open_saves: set[tuple[str, int]]
    _steps_saved: set[int]
    _second_files: set[tuple[str, int]]
    _stop: threading.Event
    _write_failure: BaseException | None
    _layout: SaveLayout
    _losses: LossWatch
    _watched: dict[int, str]

    def _save(
        self,
        trainer: pl.Trainer,
        original: Any,
        filepath: _PATH,
        weights_only: bool | None,
        storage_options: Any | None,
    ) -> None:
        reporter = self.reporter
        if reporter is None:
            original(filepath, weights_only, storage_options)
            return
        # The same values dump_checkpoint stores as "global_step"/"epoch" in this very save.
        step, epoch = trainer.global_step, trainer.current_epoch
        if step in self._steps_saved:
            # Decided here, in the main thread, in save order: the same on every rank.
            assert self._lock is not None
            with self._lock:
                self._second_files.add((str(filepath), step))
            original(filepath, weights_only, storage_options)
            return
        self._steps_saved.add(step)
        # Here, in the main thread and in save order: the steps since the previous save.
        watched = self._losses.saved()
        if watched is not None:
            self._watched[step] = watched
        self._begin(filepath, step)
        try:
            original(filepath, weights_only, storage_options)
        except BaseException as exc:
            # AsyncCheckpointIO raises an earlier write's error *after* queueing this write: the
            # IO will still finish this save (reported or failed), so close() must wait for it.
            if exc is not self._write_failure:
                self._finish(filepath, step)
            raise
        if self._layout != "file":
            self._report_sharded(trainer, filepath, step, epoch)
            return
        if trainer.is_global_zero:
            return  # ReportingCheckpointIO reports it (now, or when the async write completes)
        if _final_file_exists(filepath):
            self._report_existing(filepath, step, epoch)
            return
        watcher = threading.Thread(
            target=self._wait_and_report,
            args=(filepath, step, epoch),
            name=f"ckpt-wait-{step}",
            daemon=True,
        )
        watcher.start()

    def _begin(self, path: _PATH, step: int) -> None:
        assert self._lock is not None and self.reporter is not None
        with self._lock:
            self._open_saves.add((str(path), step))
        self.reporter.save_started()  # close() waits for it, bounded

    def _finish(self, path: _PATH, step: int) -> None:
        if self._lock is None or self.reporter is None:
            return
        with self._lock:
            if (str(path), step) not in self._open_saves:
                return
            self._open_saves.discard((str(path), step))
        self.reporter.save_finished()

    def _is_second_file(self, path: _PATH, step: int) -> bool:
        if self._lock is None:
            return False
        with self._lock:
            if (str(path), step) in self._second_files:
                self._second_files.discard((str(path), step))
                return True
        return False

    def saved(self, path: _PATH, *, step: int, epoch: int) -> None:
        """The writing rank's IO wrote ``path``: finish and report it (called by the IO)."""
        if self._is_second_file(path, step):
            return
        try:
            self._report(path, step=step, epoch=epoch)
        finally:
            self._finish(path, step)

    def save_failed(self, path: _PATH, step: int, exc: BaseException) -> None:
        """The write of ``path`` failed: never reported (called by the IO)."""
        _user_log.warning("checkpoint %s was not written, not reported: %r", path, exc)
        self._write_failure = exc
        if not self._is_second_file(path, step):
            self._finish(path, step)

    def _report_existing(self, path: _PATH, step: int, epoch: int) -> None:
        try:
            self._report(path, step=step, epoch=epoch)
        finally:
            self._finish(path, step)

    def _report_sharded(self, trainer: pl.Trainer, path: _PATH, step: int, epoch: int) -> None:
        """After the save's barrier: every rank's files exist; this rank's own go to its
        finisher, which reports them once durable."""
        try:
            if not is_local(path):
                raise IntegrationError(
                    "dirpath", f"{path}: sharded checkpoints are reported from local directories"
                )
            directory = local_path(path)
            rank0 = trainer.is_global_zero
            files = rank_files(
                directory,
                rank=trainer.global_rank,
                saves_shared=rank0,
                required=rank0_required(self._layout) if rank0 else (),
            )
            reporter = self.reporter
            if reporter is None:
                _user_log.warning(
                    "checkpoint %s (step %s) saved after the reporter closed", path, step
                )
                return
            finish_rank_files(
                reporter,
                directory,
                files,
                step=step,
                epoch=epoch,
                loss=self._checked_loss(path, step),
                framework=f"lightning:{type(trainer.strategy).__name__}",
                checksums=self.checksums,
                post=self._post,
            ).add_done_callback(functools.partial(_say_if_deferred, path))
        except (IntegrationError, ReporterError, InvalidMessage, OSError) as exc:
            # Never into the training loop: the checkpoint stays incomplete, a resume skips it.
            _user_log.warning("checkpoint %s (step %s) not reported: %s", path, step, exc)
        finally:
            self._finish(path, step)

    def _wait_and_report(self, path: _PATH, step: int, epoch: int) -> None:
        delay, waited = 0.05, 0.0
        while not _final_file_exists(path):
            if waited >= self.wait_for_file_s or self._stop.wait(delay):
                _user_log.warning(
                    "checkpoint %s did not appear in %.0f s, not reported", path, waited
                )
                self._finish(path, step)
                return
            waited += delay
            delay = min(delay * 2, 1.0)
        self._report_existing(path, step, epoch)

    def _report(self, path: _PATH, *, step: int, epoch: int) -> None:
        reporter = self.reporter
        if reporter is None:
            _user_log.warning("checkpoint %s (step %s) saved after the reporter closed", path, step)
            return
        uri, loss = checkpoint_uri(path), self._checked_loss(path, step)
        loss, _, non_finite = without_non_finite(loss, {})
        extra = {NON_FINITE_FIELD: non_finite} if non_finite else None
        try:
            if is_local(path):
                # The finisher fsyncs, hashes (checksums) and reports with bytes/sha256 set.
                # Rank 0 wrote the file and uploads it; the others report the same object.
                zero = self._trainer is None or self._trainer.is_global_zero
                reporter.finish(
                    [local_path(path)],
                    checksums=self.checksums,
                    post=self._post if zero else waiting(self._post),
                    step=step,
                    epoch=epoch,
                    uri=uri,
                    loss=loss,
                    extra=extra,
                ).add_done_callback(functools.partial(_say_if_deferred, path))
            else:
                # An object store's put is durable when it returns; its size is not ours to read.
                reporter.report(step=step, epoch=epoch, uri=uri, loss=loss, extra=extra)
        except (ReporterError, InvalidMessage, OSError) as exc:
            # Never into the training loop (or Lightning's save thread): the checkpoint stays
            # unreported, hence incomplete, and a resume takes an earlier one.
            _user_log.warning("could not report checkpoint %s (step %s): %s", path, step, exc)

    def _checked_loss(self, path: _PATH, step: int) -> Any:
        """The loss as logged, or the non-finite one a training step since the previous save
        had (whatever was logged); a NaN/infinite one is said once per checkpoint (global rank
        0) and recorded as absent by the caller."""
        loss, name = self._loss(), self.loss_metric
        watched = self._watched.get(step)
        if watched is not None and not without_non_finite(loss, {})[2]:
            loss, name = float(watched), "the training loss of a step since the previous save"
        _, _, non_finite = without_non_finite(loss, {})
        if non_finite and (self._trainer is None or self._trainer.is_global_zero):
            _user_log.warning(
                "%s (step %s): %s=%s not finite, recorded as absent (extra.%s; never the best"
                " checkpoint); the checkpoint is reported",
                path,
                step,
                name,
                non_finite["loss"],
                NON_FINITE_FIELD,
            )
        return loss

    def _loss(self) -> Any:
        if self.loss_metric is None or self._trainer is None:
            return None
        return self._trainer.callback_metrics.get(self.loss_metric)


def _say_if_deferred(path: _PATH, future: Future[FinishOutcome]) -> None:
    """On the finisher's thread: a checkpoint left unfinished (an upload failing, close's
    deadline) is one line on stderr with why, as the Trainer callback says it (a dropped one
    has its own warning from the finisher)."""
    outcome = future.result()
    if outcome.status == "deferred":
        _user_log.warning(
            "checkpoint %s (step %s) not reported (deferred): %s",
            path,
            outcome.step,
            outcome.reason,
        )


def _final_file_exists(path: _PATH) -> bool:
    if is_local(path):
        return Path(path).exists()
    return bool(get_filesystem(path).exists(str(path)))
