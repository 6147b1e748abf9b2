"""Hugging Face ``transformers.Trainer`` integration: report each checkpoint once it is on disk.

The hook: in transformers 5.x, ``Trainer._maybe_log_save_evaluate`` calls
``_save_checkpoint(model, trial)`` and then ``callback_handler.on_save(...)``, on every process
and with no barrier in between. So ``on_save`` on a process means *this* process finished its own
part of ``checkpoint-N``, not that the others did; each process therefore reports only what it
wrote, and the checkpoint counts as complete once all ``world_size`` processes reported
(docs/DESIGN.md). ``on_save`` is also the only hook after the write: ``on_step_end`` runs before
it, and ``on_train_end`` only after the last step.

Which files of ``checkpoint-N`` each process writes, and so reports, is decided by the rules of
``trainer_client.storage.hf_layout`` (pure: no transformers import). At ``on_save`` a
process lists the directory, takes the files that are its own by those rules, checks that the
ones it must have written are there (process 0: the commit markers, so a save that did not
commit is never complete), and
hands them to the reporter's finisher (:meth:`CheckpointReporter.finish`), which writes the job
in the spool and returns: ``on_save`` costs the training loop a directory listing and one small
file written without fsync, whatever the checkpoint's size. In the background the finisher fsyncs
the files, their directories and the job (transformers does not fsync; a report must not
outlive a power cut that the checkpoint does not), hashes them with ``checksums=True``, and only
then reports. A checkpoint that ``save_total_limit`` removes meanwhile is not reported (a warning,
``reporter.stats.finish_dropped``); one whose process is killed meanwhile is finished by the next
start on the same spool. Files of other processes may still be being written at that moment,
which is why they are never touched or counted.

Every process reports the same ``uri``, the ``file://`` URI of the ``checkpoint-N`` directory:
that is what ``resume_from_checkpoint=`` takes, and what
``trainer_client.restart.lookup.latest_complete_checkpoint`` returns as ``.path`` when every
rank reported the same URI. The files a process wrote are in ``extra["files"]`` (relative to the
directory) and their total size in ``bytes``.

DeepSpeed with a checkpoint engine that writes after ``save_checkpoint`` returns (a
``checkpoint.writer``, DataStates, Nebula) is refused at ``on_train_begin``; so is, at
``on_save``, a ZeRO file of a model-parallel rank other than 00 (the checkpoint is then not
reported). DeepSpeed's MoE expert files carry no process index: process 0 reports them (the save
ended in a barrier, so they are complete when it lists them).

Needs the ``huggingface`` extra: ``pip install 'ckpt-pipeline[huggingface]'``.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from ckpt_contract import InvalidMessage
from trainer_client.config import TuningKnobs
from trainer_client.exceptions import ExtraMissing, IntegrationError, ReporterError
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.finish.finisher import FinishOutcome
from trainer_client.finish.post_step import PostStep
from trainer_client.integrations._loss_watch import LossWatch, find_trainer
from trainer_client.integrations._upload import check_upload, with_upload
from trainer_client.integrations.sharded import list_files
from trainer_client.report._fields import NON_FINITE_FIELD, without_non_finite
from trainer_client.report.reporter import CheckpointReporter
from trainer_client.storage.hf_layout import (
    files_written_by_process,
    owner_of,
    required_files,
)
from trainer_client.storage.layouts import deepspeed_config_refusal

if TYPE_CHECKING:
    from trainer_client.restart.resume import Resumed

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError:  # pragma: no cover - exercised by the packaging test's base install
    raise ExtraMissing(
        "transformers", "the Trainer callback needs pip install 'ckpt-pipeline[huggingface]'"
    ) from None

_log = logging.getLogger(__name__)
# What the user must see whether or not they configured logging: a checkpoint left unreported,
# a metric recorded as absent. Under the "transformers" logger, whose own stderr handler
# (WARNING by default, transformers.logging.set_verbosity_*) the Trainer's users already know.
_user_log = logging.getLogger("transformers.ckpt_reporter")

# owner_of and required_files: the layout's rules, importable from here as before.
__all__ = ["CheckpointReporterCallback", "owner_of", "required_files"]


class CheckpointReporterCallback(TrainerCallback):  # type: ignore[misc]
    """Reports every ``checkpoint-N`` the ``Trainer`` saves, per process, once durably written.

    The reporter is built at ``on_train_begin`` with ``rank = args.process_index`` and
    ``world_size = args.world_size``; job id, queue URL and ``run_attempt`` come from the
    arguments or the environment exactly as :class:`CheckpointReporter` resolves them. It is
    flushed and closed at ``on_train_end``; if ``train()`` raises, ``on_train_end`` never runs, so
    call :meth:`close` in a ``finally`` (an ``atexit`` hook closes it otherwise). Reports spooled
    but unsent survive in ``spool_dir`` and are sent by the next start.

    A report that cannot be made (a file it must have written is missing, the spool refuses, the
    checkpoint was rotated away before it was finished) is logged and counted in
    :attr:`failures`, never raised into ``train()``: the checkpoint then simply never becomes
    complete, and a resume uses an older one. :attr:`reported_steps` lists the steps reported,
    in the order their finishing completed.

    ``checksums=True`` adds each file's SHA-256 (``extra["file_sha256"]``), computed by the
    finisher. ``post`` names post-steps (registered by ``post_steps``, see
    :mod:`trainer_client.finish.post_step`) to run on every checkpoint before it is reported.
    ``upload_to="s3://bucket/prefix"`` uploads each process's files of ``checkpoint-N`` to
    ``prefix/checkpoint-N/`` in the background and reports ``s3://…/checkpoint-N`` with every
    object pinned, only once all of them are stored (:mod:`trainer_client.storage.s3_finish`;
    ``upload`` is a configured ``S3Upload`` to use instead of the default).
    """

    def __init__(
        self,
        spool_dir: str | os.PathLike[str] | None = None,
        *,
        queue_url: str | None = None,
        job_id: str | None = None,
        run_attempt: int | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        checksums: bool = False,
        post: Sequence[PostStepCall] = (),
        post_steps: Sequence[PostStep] = (),
        upload_to: str | None = None,
        upload: PostStep | None = None,
        reporter: CheckpointReporter | None = None,
        **tuning: Unpack[TuningKnobs],
    ) -> None:
        post, post_steps = with_upload(upload_to, post, post_steps, upload=upload)
        self._options: dict[str, Any] = {
            "queue_url": queue_url,
            "job_id": job_id,
            "spool_dir": spool_dir,
            "run_attempt": run_attempt,
            "endpoint_url": endpoint_url,
            "region": region,
            "post_steps": post_steps,
            **tuning,
        }
        self._checksums = checksums
        self._post = tuple(post)
        # A reporter given by the caller is the caller's to close.
        self._owns_reporter = reporter is None
        self.reporter: CheckpointReporter | None = reporter
        self.failures = 0
        self.reported_steps: list[int] = []
        # What resume() decided (None before it is called or when there was nothing).
        self.resumed: Resumed | None = None
        self._lock = threading.Lock()
        self._upload_checked = False
        self._losses = LossWatch()
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- the restart ---------------------------------------------------------------------------

    def resume(
        self,
        args: TrainingArguments | None = None,
        *,
        database_url: str | None = None,
        restore_to: str | os.PathLike[str] | None = None,
        deadline_s: float | None = None,
        s3_client: Any = None,
        start_over: bool = False,
        resume_diverged: bool = False,
    ) -> str | None:
        """The restart's collective call (every process, before ``train()``): the local
        ``checkpoint-N`` to pass to ``train(resume_from_checkpoint=…)``, or None to start fresh.

        Builds this process's reporter now (rank and world size from ``args``, whose reading
        sets up torch.distributed through accelerate, so the ranks agree through it; without
        ``args`` from torch.distributed or ``RANK``/``WORLD_SIZE``) so that what the killed
        process left in the spool is sent and written first; see
        :func:`trainer_client.restart.resume.resume`. A checkpoint
        uploaded with ``upload_to`` is restored to where it was uploaded from
        (``output_dir/checkpoint-N``) unless ``restore_to`` names another directory.
        A checkpoint trained on a non-finite loss is skipped (one line names it) unless
        ``resume_diverged``.
        """
        from trainer_client.restart.resume import DEFAULT_DEADLINE_S, resume

        with self._lock:
            if self.reporter is None:
                self.reporter = CheckpointReporter(
                    **self._options,
                    rank=None if args is None else int(args.process_index),
                    world_size=None if args is None else int(args.world_size),
                )
                self._owns_reporter = True
            reporter = self.reporter
        self.resumed = resume(
            reporter,
            database_url=database_url,
            restore_to=restore_to,
            deadline_s=DEFAULT_DEADLINE_S if deadline_s is None else deadline_s,
            s3_client=s3_client,
            start_over=start_over,
            resume_diverged=resume_diverged,
        )
        return self.resumed.path if self.resumed is not None else None

    # -- the Trainer's hooks -------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Build the reporter for this process (once; a second ``train()`` reuses it)."""
        ds_config = getattr(getattr(args, "hf_deepspeed_config", None), "config", None)
        reason = deepspeed_config_refusal(ds_config) if isinstance(ds_config, dict) else None
        if reason:
            raise IntegrationError("deepspeed", f"not supported: {reason}")
        if not self._upload_checked:
            # Every process: each uploads its own files of checkpoint-N.
            check_upload(self._post, self._options["post_steps"])
            self._upload_checked = True
        if args.save_total_limit == 1:
            _log.warning(
                "save_total_limit=1 deletes the previous checkpoint before the new one is "
                "complete; a resume may then find no complete checkpoint on disk. Use >= 2."
            )
        with self._lock:
            if self.reporter is None:
                self.reporter = CheckpointReporter(
                    **self._options, rank=args.process_index, world_size=args.world_size
                )
                self._owns_reporter = True
        trainer = find_trainer(self)
        if trainer is not None:
            self._losses.attach(trainer)
        elif args.logging_nan_inf_filter and state.is_world_process_zero:
            _user_log.warning(
                "cannot watch the training loss (a Trainer that calls its callbacks otherwise):"
                " with logging_nan_inf_filter=True a NaN/infinite loss may be reported as the"
                " finite value the filter logs; logging_nan_inf_filter=False avoids it"
            )

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        """The training loss was logged (every process): agree on its window's flags."""
        if logs and "loss" in logs:
            self._losses.logged()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Tell the finisher a step is in flight (its ``step_pause_s`` waits for the end)."""
        if self.reporter is not None:
            self.reporter.step_began()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """The step ended."""
        if self.reporter is not None:
            self.reporter.step_ended()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Runs after ``_save_checkpoint`` returned on this process: report this process's part."""
        reporter = self.reporter
        if reporter is None:  # on_save without on_train_begin: not a Trainer we know
            _log.error(
                "on_save before on_train_begin: checkpoint %s not reported", state.global_step
            )
            self.failures += 1
            return
        directory = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        try:
            self._report(reporter, args, state, directory)
        except (ReporterError, InvalidMessage, OSError) as exc:
            self.failures += 1
            _user_log.warning(
                "[job=%s rank=%s] checkpoint %s not reported: %s",
                reporter.config.job_id,
                reporter.config.rank,
                directory,
                exc,
            )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Flush (bounded by ``close_timeout_s``) and close the reporter."""
        self._losses.detach()
        self.close()

    # -- reporting -----------------------------------------------------------------------------

    def _report(
        self,
        reporter: CheckpointReporter,
        args: TrainingArguments,
        state: TrainerState,
        directory: Path,
    ) -> None:
        files = files_written_by_process(
            directory,
            list_files(directory),
            process_index=int(args.process_index),
            world_size=int(args.world_size),
            should_save=bool(args.should_save),
            save_only_model=bool(args.save_only_model),
        )
        epoch = state.epoch or 0.0
        # The Trainer's epoch is fractional (1.5 = halfway through the second); the contract's
        # is an integer. A NaN/infinite loss is recorded as absent, never loses the checkpoint;
        # so is a logged loss when a step since the previous save had a non-finite one (the
        # logging filter's stand-in is not the checkpoint's loss: _loss_watch).
        watched = self._losses.saved()
        loss, metrics, non_finite = without_non_finite(_last_loss(state), {"epoch": float(epoch)})
        if watched is not None and "loss" not in non_finite:
            loss, non_finite = None, {"loss": watched, **non_finite}
        extra: dict[str, Any] = {"framework": "transformers"}
        if non_finite:
            extra[NON_FINITE_FIELD] = non_finite
            if state.is_world_process_zero:  # the same logged loss on every process
                _user_log.warning(
                    "%s: %s not finite, recorded as absent (extra.%s; never the best"
                    " checkpoint); the checkpoint is reported",
                    directory.name,
                    ", ".join(f"{k}={v}" for k, v in non_finite.items()),
                    NON_FINITE_FIELD,
                )
        # The finisher fsyncs the files, checkpoint-N and output_dir, hashes with checksums,
        # then reports with bytes (and extra["files"], extra["file_sha256"]) filled in.
        finished = reporter.finish(
            [directory / name for name in files],
            base=directory,
            checksums=self._checksums,
            list_files=True,
            post=self._post,
            step=int(state.global_step),
            epoch=math.floor(epoch),
            uri=directory.resolve().as_uri(),
            loss=loss,
            metrics=metrics,
            extra=extra,
        )
        finished.add_done_callback(self._finished)

    def _finished(self, future: Future[FinishOutcome]) -> None:
        # On the finisher thread, once the checkpoint is reported, dropped or deferred.
        outcome = future.result()
        with self._lock:
            if outcome.status == "reported":
                self.reported_steps.append(outcome.step)
                return
            self.failures += 1
        _user_log.warning(
            "checkpoint-%s not reported (%s): %s", outcome.step, outcome.status, outcome.reason
        )

    # -- shutdown ------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> bool:
        """Flush and close the reporter (if this callback built it); True when all was sent."""
        with self._lock:
            reporter, self.reporter = self.reporter, None
            owns = self._owns_reporter
        if reporter is None or not owns:
            return True
        return reporter.close(timeout)


def _last_loss(state: TrainerState) -> float | None:
    # The Trainer logs the loss averaged over all processes (nested_gather), so every process
    # has the same value in its log_history.
    for entry in reversed(state.log_history):
        if "loss" in entry:
            return float(entry["loss"])
    return None


def _close_at_exit(ref: weakref.ref[CheckpointReporterCallback]) -> None:
    callback = ref()
    if callback is not None:
        try:
            callback.close()
        except Exception:
            _log.exception("closing the checkpoint reporter at exit")
