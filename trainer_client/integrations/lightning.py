"""Lightning 2.x: report each checkpoint to the pipeline only once its file is durably written.

Lightning's ``on_save_checkpoint`` hook runs *before* the file is written, so a report from it can
claim a checkpoint that never lands. Here instead:

* :class:`ReportingCheckpointIO` wraps the strategy's ``CheckpointIO`` (Lightning's
  ``TorchCheckpointIO`` by default). After the inner write returns it hands the file to the
  reporter's finisher (:meth:`CheckpointReporter.finish`: a job recorded durably in the spool, then
  back to training), which fsyncs the file and its directory, hashes it with ``checksums=True``,
  and only then reports. Under ``AsyncCheckpointIO(reporting.checkpoint_io)`` this runs in
  Lightning's save thread, so the job follows the completed write; a failed write raises there and
  is never reported. A file ``save_top_k`` removes before it is finished is not reported (a
  warning, ``reporter.stats.finish_dropped``).
* :class:`CheckpointReporting` (a callback) owns the ``CheckpointReporter``: opened at ``setup``
  with rank and world size from the trainer's strategy (job id, spool, queue and run_attempt from
  the environment as for any reporter, unless given), flushed and closed at ``teardown`` and on
  an exception.

Which ranks report, and what completeness then means
----------------------------------------------------
How the strategy saves decides (``_lightning_layout.save_layout``, checked at ``setup``):

* **One file** (single device, DDP and its spawn/fork variants, ``FSDPStrategy`` with
  ``state_dict_type="full"``, ``ModelParallelStrategy(save_distributed_checkpoint=False)``): the
  global-zero rank writes ONE file through CheckpointIO and ``Trainer.save_checkpoint`` then
  barriers. A checkpoint is nevertheless complete only with ``world_size`` reports
  (docs/DESIGN.md), so rank 0 reports the file from its CheckpointIO, after the durable write;
  every other rank reports the *same* URI once that file exists at its final path (Lightning
  writes it to a temporary name and renames it into place, so existence means fully written),
  through its own finisher (which fsyncs it first): at once after the save barrier for a
  synchronous write, from a watcher thread for an asynchronous one (bounded by
  ``wait_for_file_s``).
  So "complete" reads: rank 0's file is durable and every rank took part in that save.
* **Sharded** (``FSDPStrategy`` sharded, ``ModelParallelStrategy``, ``DeepSpeedStrategy``): each
  rank writes its own files into the checkpoint's directory, bypassing CheckpointIO. After the
  save's barrier every rank lists that directory, takes the files that are its own
  (``trainer_client.integrations.sharded``) and hands them to its finisher, which makes them
  durable and reports them, the directory as its URI. Rank 0 reports only with the layout's
  commit marker present (DCP's ``.metadata`` and Lightning's ``meta.pt``; DeepSpeed's
  ``latest``). "Complete" reads: every rank's files are durable and the save committed. The
  CheckpointIO plugin is not needed there (nor used).

One file per step is reported: the first one saved at that step; a second (``save_last``'s
``last.ckpt`` copy) is written but not reported, so every rank names the same file. A reported
URI must keep naming that checkpoint: keep ModelCheckpoint's unique names (its version counter
on) rather than a name that a later save overwrites. A rank killed before its report leaves the
checkpoint incomplete, and a resume takes the previous one. Strategies that save some other way
(XLA, a subclass overriding ``save_checkpoint``, DeepSpeed with a background checkpoint engine)
are refused at ``setup`` rather than reported wrongly.

Lightning has no hook that runs after the save barrier, so the callback wraps the
``save_checkpoint`` method of the one trainer it is attached to for the duration of the stage
(every save — ModelCheckpoint's, on-exception, manual — goes through it), and restores it at
teardown. A save made outside ``fit()`` is not reported.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer_client.config import TuningKnobs
from trainer_client.exceptions import ExtraMissing, IntegrationError
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.finish.post_step import PostStep
from trainer_client.integrations._loss_watch import LossWatch
from trainer_client.integrations._upload import check_upload, with_upload
from trainer_client.report.reporter import CheckpointReporter

if TYPE_CHECKING:
    from trainer_client.restart.resume import Resumed

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
    from lightning.fabric.utilities.types import _PATH
    from lightning.pytorch.plugins import AsyncCheckpointIO

    from trainer_client.integrations._lightning_layout import SaveLayout, save_layout
    from trainer_client.integrations._lightning_saves import LightningSaves
except ImportError:  # the base install has no lightning (tests/integrations/test_lightning.py)
    raise ExtraMissing(
        "lightning", "the Lightning integration needs pip install 'ckpt-pipeline[lightning]'"
    ) from None

_log = logging.getLogger(__name__)
# What the user must see whether or not they configured logging (a checkpoint left unreported, a
# loss recorded as absent): under Lightning's "lightning.pytorch" logger, which prints to stderr
# by itself when the script configured no logging.
_user_log = logging.getLogger("lightning.pytorch.ckpt_reporter")

DEFAULT_WAIT_FOR_FILE_S = 600.0


class ReportingCheckpointIO(CheckpointIO):
    """A CheckpointIO that reports each checkpoint after its write is durable (see the module)."""

    def __init__(self, reporting: CheckpointReporting, inner: CheckpointIO | None = None) -> None:
        super().__init__()
        if isinstance(inner, AsyncCheckpointIO):
            raise IntegrationError(
                "checkpoint_io",
                "an AsyncCheckpointIO inside the reporting IO would report before the write; "
                "wrap it the other way: AsyncCheckpointIO(reporting.checkpoint_io)",
            )
        self.reporting = reporting
        self.inner = inner if inner is not None else TorchCheckpointIO()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        """Write through the inner IO, make it durable, then report it (this rank's shard)."""
        step, epoch = int(checkpoint["global_step"]), int(checkpoint["epoch"])
        try:
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        except BaseException as exc:
            self.reporting.save_failed(path, step, exc)
            raise
        self.reporting.saved(path, step=step, epoch=epoch)

    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The inner IO's load."""
        return self.inner.load_checkpoint(path, map_location, weights_only)

    def remove_checkpoint(self, path: _PATH) -> None:
        """The inner IO's remove (the resume helper skips checkpoints whose file is gone)."""
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        """The inner IO's teardown."""
        self.inner.teardown()


class CheckpointReporting(LightningSaves, pl.Callback):
    """Reports every checkpoint of ``fit()`` through a ``CheckpointReporter`` on each rank.

    Add it to ``callbacks=`` and its :attr:`checkpoint_io` to ``plugins=`` (or
    ``AsyncCheckpointIO(reporting.checkpoint_io)``). Reporter settings left ``None`` come from the
    environment as for :class:`~trainer_client.CheckpointReporter` (``CKPT_QUEUE_URL``,
    ``CKPT_JOB_ID``, ``CKPT_SPOOL_DIR``, ``TORCHELASTIC_RESTART_COUNT``). ``loss_metric`` names a
    logged metric reported as the checkpoint's loss; ``checksums=True`` reports each file's
    SHA-256 (computed by the finisher, off the training thread); ``post`` names post-steps
    (registered by ``post_steps``, see :mod:`trainer_client.finish.post_step`) to run on every local
    checkpoint before it is reported. ``upload_to="s3://bucket/prefix"`` uploads each local
    checkpoint file in the background (``prefix/<dirpath's name>/<file>``) and reports its
    ``s3://`` URI with the object pinned, once stored (:mod:`trainer_client.storage.s3_finish`).
    """

    def __init__(
        self,
        *,
        queue_url: str | None = None,
        job_id: str | None = None,
        spool_dir: str | Path | None = None,
        run_attempt: int | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        loss_metric: str | None = None,
        wait_for_file_s: float = DEFAULT_WAIT_FOR_FILE_S,
        checksums: bool = False,
        post: Sequence[PostStepCall] = (),
        post_steps: Sequence[PostStep] = (),
        upload_to: str | None = None,
        upload: PostStep | None = None,
        tuning: TuningKnobs | None = None,
        checkpoint_io: CheckpointIO | None = None,
    ) -> None:
        post, post_steps = with_upload(upload_to, post, post_steps, upload=upload)
        if not wait_for_file_s > 0:
            raise IntegrationError("wait_for_file_s", "must be > 0 seconds")
        self._options: dict[str, Any] = {
            "queue_url": queue_url,
            "job_id": job_id,
            "spool_dir": spool_dir,
            "run_attempt": run_attempt,
            "endpoint_url": endpoint_url,
            "region": region,
            "post_steps": post_steps,
        }
        self._post = tuple(post)
        self._tuning: TuningKnobs = tuning or {}
        self.loss_metric = loss_metric
        self.checksums = checksums
        self.wait_for_file_s = wait_for_file_s
        self.checkpoint_io = ReportingCheckpointIO(self, checkpoint_io)
        self.reporter: CheckpointReporter | None = None
        # Built by resume() before fit(); setup() takes it over.
        self._early_reporter: CheckpointReporter | None = None
        self.resumed: Resumed | None = None
        self._trainer: pl.Trainer | None = None
        # Created in setup: ddp_spawn pickles the callback, and a lock does not pickle.
        self._lock: threading.Lock | None = None
        # (path, step) of saves not yet reported or given up; close() waits for them.
        self._open_saves: set[tuple[str, int]] = set()
        # Steps already saved in this stage: a second file of a step (save_last's copy) is
        # written but not reported, so every rank reports the same, first, file of each step.
        self._steps_saved: set[int] = set()
        self._second_files: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._closing = False
        self._write_failure: BaseException | None = None
        self._layout: SaveLayout = "file"
        self._upload_checked = False
        # Each training step's own loss (outputs of training_step), and what it said at each
        # save (step -> "nan"/"inf"): the logged metric may be stale or absent (_loss_watch).
        self._losses = LossWatch()
        self._watched: dict[int, str] = {}

    def resume(
        self,
        *,
        database_url: str | None = None,
        restore_to: str | Path | None = None,
        deadline_s: float | None = None,
        s3_client: Any = None,
        start_over: bool = False,
        resume_diverged: bool = False,
    ) -> str | None:
        """The restart's call, before ``fit()``: the local checkpoint file to pass as
        ``fit(ckpt_path=…)``, or None to start fresh
        (:func:`trainer_client.restart.resume.resume`).

        Lightning initialises ``torch.distributed`` inside ``fit()``, so unless the script did it
        before, each process sends its own spool, waits for its own reports and asks the
        database on its own; ``on_train_start`` then refuses ranks that resumed differently. A
        checkpoint uploaded with ``upload_to`` is restored to the file it was uploaded from,
        unless ``restore_to`` names a directory.
        A checkpoint trained on a non-finite loss is skipped (one line names it) unless
        ``resume_diverged``.
        """
        from trainer_client.restart.resume import DEFAULT_DEADLINE_S, resume

        if self._early_reporter is None:
            self._early_reporter = CheckpointReporter(**self._options, **self._tuning)
        self.resumed = resume(
            self._early_reporter,
            database_url=database_url,
            restore_to=restore_to,
            deadline_s=DEFAULT_DEADLINE_S if deadline_s is None else deadline_s,
            s3_client=s3_client,
            start_over=start_over,
            resume_diverged=resume_diverged,
        )
        return self.resumed.path if self.resumed is not None else None

    # -- Lightning hooks ---------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Check the strategy saves the way this module assumes; open the reporter; wrap saves."""
        if self.reporter is not None:
            return
        strategy = trainer.strategy
        self._layout = save_layout(strategy)
        if self._layout == "file" and not _uses(strategy.checkpoint_io, self.checkpoint_io):
            raise IntegrationError(
                "plugins",
                "the trainer does not save through this callback's IO: pass "
                "plugins=[reporting.checkpoint_io] (or AsyncCheckpointIO(reporting.checkpoint_io))",
            )
        if not self._upload_checked:
            check_upload(self._post, self._options["post_steps"])
            self._upload_checked = True
        self._lock = threading.Lock()
        self._stop.clear()
        self._steps_saved.clear()
        self._second_files.clear()
        self.reporter = self._early_reporter or CheckpointReporter(
            **self._options, rank=trainer.global_rank, world_size=trainer.world_size, **self._tuning
        )
        self._early_reporter = None
        self._trainer = trainer
        original = trainer.save_checkpoint

        @functools.wraps(original)
        def save_checkpoint(
            filepath: _PATH, weights_only: bool | None = None, storage_options: Any | None = None
        ) -> None:
            self._save(trainer, original, filepath, weights_only, storage_options)

        # An instance attribute: only this trainer, only until teardown removes it again.
        trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Refuse to train when the ranks resumed from different checkpoints or attempts.

        Each rank asks the database for itself before ``fit()`` (there is no process group yet
        to share one answer); a report landing between two ranks' questions could give them
        different answers, and DDP would then train diverged replicas without a word.
        """
        assert self.reporter is not None
        strategy = trainer.strategy
        mine = (str(trainer.ckpt_path), trainer.global_step, self.reporter.config.run_attempt)
        first = strategy.broadcast(mine, src=0)
        if not strategy.reduce_boolean_decision(mine == first, all=True):
            raise IntegrationError(
                "ckpt_path",
                f"ranks resumed differently (rank 0: {first}, rank {trainer.global_rank}: "
                f"{mine}; (ckpt_path, step, run_attempt)): start again, every rank the same",
            )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Tell the finisher a step is in flight (its ``step_pause_s`` waits for the end)."""
        if self.reporter is not None:
            self.reporter.step_began()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """The step ended: its loss is watched (a NaN/infinite one marks the next save)."""
        if self.reporter is not None:
            self.reporter.step_ended()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self._losses.observe(loss)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Unwrap the trainer's save; flush and close the reporter (bounded by close_timeout_s)."""
        self._close(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Lightning skips ``teardown`` hooks after an exception: close here too."""
        self._close(trainer)

    def _close(self, trainer: pl.Trainer) -> None:
        reporter = self.reporter
        if reporter is None or self._closing:
            return
        self._closing = True
        trainer.__dict__.pop("save_checkpoint", None)
        # Kept as self.reporter while close() waits: an async write finishing now still reports.
        if not reporter.close():
            _log.warning("reporter closed with reports unsent or saves unfinished (kept on disk)")
        self._stop.set()  # a watcher still waiting gives up; its checkpoint stays incomplete
        self.reporter = None
        self._trainer = None
        self._closing = False


def _uses(io: Any, ours: ReportingCheckpointIO) -> bool:
    """Whether the strategy's IO chain (AsyncCheckpointIO → …) reaches ``ours``."""
    while io is not None:
        if io is ours:
            return True
        io = getattr(io, "checkpoint_io", None)
    return False
