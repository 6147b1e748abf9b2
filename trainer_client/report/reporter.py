"""``CheckpointReporter``: validate, spool durably, return; a background thread sends to SQS."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack

from ckpt_contract import CheckpointReport, FieldError, InvalidMessage
from trainer_client._log import adapter
from trainer_client.config import Tuning, TuningKnobs, resolve_config
from trainer_client.exceptions import ReporterClosed, ReporterConfigError, SpoolUnwritable
from trainer_client.finish._pacing import StepSignal
from trainer_client.finish.finish_job import FinishJob, JobStore, PostStepCall
from trainer_client.finish.finisher import Finisher, FinishOutcome
from trainer_client.finish.post_step import PostStep
from trainer_client.report._build import build_report
from trainer_client.report._fields import ReportFields
from trainer_client.report._finish_request import (
    files_to_finish,
    finish_fields,
    finished_report,
    recover_jobs,
    registry,
)
from trainer_client.report._gate import DiskGate
from trainer_client.report._shutdown import ReporterShutdown
from trainer_client.report._sqs_client import build_sqs_client
from trainer_client.report._wake import Waker
from trainer_client.report.launch import Launch, begin_here, record, recorded_attempt
from trainer_client.report.sender import Counters, Sender
from trainer_client.report.signals import SigtermChain
from trainer_client.report.spool import Spool
from trainer_client.report.spot import SpotPoller

if TYPE_CHECKING:
    from ckpt_contract.restart import RestartRecord

__all__ = ["CheckpointReporter", "ReportFields", "ReporterStats"]


@dataclass(frozen=True)
class ReporterStats:
    """A snapshot of the reporter's counters."""

    reported: int
    sent: int
    retried: int
    failed: int
    pending: int
    sender_cpu_s: float
    finishing: int = 0
    finish_dropped: int = 0
    finish_deferred: int = 0
    finish_waits: int = 0
    saves_waiting: int = 0


class CheckpointReporter(ReporterShutdown):
    """Reports checkpoint shards to the pipeline; ``report()`` returns once the report is on disk.

    ``spool_dir`` should be durable storage that outlives the instance (EFS, the checkpoint
    volume): instance store and the root EBS volume vanish with a Spot instance, and with them
    any report not yet sent. See ``trainer_client/README.md``.
    """

    def __init__(
        self,
        queue_url: str | None = None,
        job_id: str | None = None,
        spool_dir: str | os.PathLike[str] | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        run_attempt: int | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        sqs_client: Any = None,
        post_steps: Sequence[PostStep] = (),
        **tuning: Unpack[TuningKnobs],
    ) -> None:
        try:
            knobs = Tuning(**tuning)
        except TypeError as exc:
            raise ReporterConfigError("tuning", str(exc)) from None
        if job_id is not None and not isinstance(job_id, str):
            raise ReporterConfigError("job_id", f"must be a string, got {type(job_id).__name__}")
        self.config = resolve_config(
            queue_url=queue_url,
            job_id=job_id,
            spool_dir=spool_dir,
            rank=rank,
            world_size=world_size,
            run_attempt=run_attempt,
            endpoint_url=endpoint_url,
            region=region,
            tuning=knobs,
        )
        cfg = self.config
        self._log = adapter(__name__, cfg.job_id, cfg.rank)
        # An injected client (thread-safe in boto3) lets many simulated ranks of one process share
        # one, as the fan-in benchmark does; a real rank builds its own.
        client = sqs_client if sqs_client is not None else build_sqs_client(cfg)
        try:
            self._spool = Spool(
                cfg.spool_dir / cfg.job_id,
                cfg.rank,
                max_bytes=knobs.max_spool_bytes,
                max_records=knobs.max_pending_records,
                compact_threshold_bytes=knobs.compact_threshold_bytes,
                log=adapter("trainer_client.report.spool", cfg.job_id, cfg.rank),
            )
        except (PermissionError, IsADirectoryError, NotADirectoryError) as exc:
            raise ReporterConfigError("spool_dir", f"not writable: {exc}") from None
        except SpoolUnwritable:
            raise
        except OSError as exc:
            if exc.errno == errno.EROFS:
                raise ReporterConfigError("spool_dir", f"read-only file system: {exc}") from None
            raise SpoolUnwritable(
                str(cfg.spool_dir / cfg.job_id), exc.errno or errno.EIO, str(exc)
            ) from exc
        # The launch this process reports as (trainer_client/report/launch.py): begun by the restart
        # call, else at the first report; the attempt this spool recorded before, to number it.
        self._launch: Launch | None = None
        self._launch_lock = threading.Lock()
        self._attempt_given = run_attempt is not None
        # A launch begun and not yet recorded beside the spool (written with its first report).
        self._unrecorded: Launch | None = None
        self._record_lock = threading.Lock()
        self.recorded_attempt = recorded_attempt(cfg.spool_dir / cfg.job_id, cfg.rank)
        self._counters = Counters()
        self._waker = Waker()
        self._gate = DiskGate()
        self._progress = threading.Condition()
        self._closed = False
        # Async saves whose completion will call report(): close() waits for them (bounded).
        self._saves = threading.Condition()
        self._pending_saves = 0
        self._sender = Sender(
            spool=self._spool,
            client=client,
            queue_url=cfg.queue_url,
            job_id=cfg.job_id,
            run_attempt=cfg.run_attempt,
            rank=cfg.rank,
            batch_size=knobs.batch_size,
            backoff_base_s=knobs.backoff_base_s,
            backoff_cap_s=knobs.backoff_cap_s,
            backlog_warning_interval_s=knobs.backlog_warning_interval_s,
            counters=self._counters,
            waker=self._waker,
            gate=self._gate,
            progress=self._progress,
            log=self._log,
            on_signal=self._on_sigterm,
        )
        directory = cfg.spool_dir / cfg.job_id
        self._training_steps = StepSignal()
        self._finisher = Finisher(
            store=JobStore(directory / f"rank-{cfg.rank}.finishing", self._log),
            report=self._report_finished,
            post_steps=registry(post_steps),
            tuning=knobs,
            training_steps=self._training_steps,
            log=self._log,
        )
        self._jobs = self._finisher.store
        self._submit_lock = threading.Lock()
        self._sigterm = SigtermChain(self._signal_received)
        if knobs.install_signal_handler and not self._sigterm.install():
            self._log.debug("not in the main thread: no SIGTERM handler installed")
        self._spot: SpotPoller | None = None
        self._sender.start()
        self._finisher.start()
        self._recover_jobs()
        if cfg.spot_poll:
            self._spot = SpotPoller(
                cfg.imds_endpoint, knobs.spot_poll_interval_s, self._spot_notice, self._log
            )
            self._spot.start()
        self._log.debug("reporter started: spool %s, queue %s", self._spool.path, cfg.queue_url)

    # -- the training loop's API -------------------------------------------------------------

    def prepare(self, **fields: Unpack[ReportFields]) -> CheckpointReport:
        """Build and validate a report without spooling it; raises ``InvalidMessage``."""
        return self._build(fields)[0]

    def _build(self, fields: Mapping[str, Any]) -> tuple[CheckpointReport, str]:
        """The validated report and its encoded body (encoded once: report() spools that)."""
        if self._launch is None:
            self._begin_launch_here()
        return build_report(self.config, fields)

    def report(self, **fields: Unpack[ReportFields]) -> CheckpointReport:
        """Validate and durably spool one shard's report (fsync'd), then return; sent in background.

        The caller vouches that the checkpoint is durable; :meth:`finish` makes it so first.
        Raises ``InvalidMessage`` for bad arguments (nothing spooled), ``SpoolFull`` at the hard
        bound, ``SpoolUnwritable`` when the disk refuses (full, I/O error; nothing spooled),
        ``ReporterClosed`` after close(). Never raises because SQS is unreachable.
        """
        return self._spool_report(fields)

    def _spool_report(self, fields: Mapping[str, Any]) -> CheckpointReport:
        if self._closed:
            raise ReporterClosed("report() after close()")
        # The sender steps aside (GIL released) until this report is on disk; closing the gate
        # never waits for it (see _gate.py).
        with self._gate.closed():
            return self._spool_built(*self._build(fields))

    def _spool_built(self, report: CheckpointReport, body: str) -> CheckpointReport:
        """Append a built report's body (fsync'd) and wake the sender."""
        # With the step, kept in memory beside the record: the sender derives the SQS ids
        # from it (not here: ~60 us after an idle pause) and need not parse the body back.
        # A report of another attempt (a job recovered from an earlier one) is parsed.
        cfg = self.config
        own = report.run_attempt == cfg.run_attempt and report.launch_id == cfg.launch_id
        if own and self._unrecorded is not None:
            self._record_now()
        self._spool.append(body, step=report.step if own else None)
        self._counters.reported += 1
        self._sender.wake()
        return report

    def finish(
        self,
        files: Sequence[str | os.PathLike[str]],
        *,
        base: str | os.PathLike[str] | None = None,
        checksums: bool = False,
        list_files: bool = False,
        staged: Mapping[str, str] | None = None,
        post: Sequence[PostStepCall] = (),
        **fields: Unpack[ReportFields],
    ) -> Future[FinishOutcome]:
        """Report a saved checkpoint once its files are durable, from the background finisher.

        Returns as soon as the job is written (one small file, no fsync: the training loop
        never waits on the disk); the finisher then fsyncs ``files`` and their directories up to
        ``base`` (default: the first file's directory) and its parent, then the job record,
        hashes them when ``checksums``, runs the ``post`` steps and reports with ``bytes`` (and,
        for one file, ``sha256``) filled in.
        ``list_files`` puts the names relative to ``base`` (and their digests) in ``extra``.
        ``staged`` maps a final path to the temporary file the finisher renames onto it once
        durable. Waits (logged) only when ``max_finishing`` jobs are already in progress.

        Raises ``InvalidMessage`` for bad fields and ``FileNotFoundError`` for a missing file, at
        the call. The future's :class:`FinishOutcome` says whether it was reported, dropped
        (files removed or changed meanwhile) or deferred to the next start (close's deadline).
        """
        if self._closed:
            raise ReporterClosed("finish() after close()")
        for name in ("bytes", "sha256"):
            if fields.get(name) is not None:
                raise InvalidMessage([FieldError(name, "is measured by finish(); do not pass it")])
        root, to_finish = files_to_finish(files, base, staged)
        if self._launch is None:
            self._begin_launch_here()
        report, stored = finish_fields(self.config, fields, to_finish, list_files=list_files)
        waited = self._finisher.take_slot()
        if waited:
            self._log.warning(
                "save of step %s waited %.2f s for the finisher (max_finishing=%s in progress)",
                report.step,
                waited,
                self.config.tuning.max_finishing,
            )
        try:
            with self._submit_lock:
                job = FinishJob(
                    seq=self._jobs.next_seq(),
                    base=str(root),
                    files=to_finish,
                    fields=stored,
                    run_attempt=self.config.run_attempt,
                    world_size=self.config.world_size,
                    checksums=checksums,
                    list_files=list_files,
                    post=tuple(post),
                    launch_id=self.config.launch_id,
                )
                self._jobs.save(job)
                # Under the lock: the finisher takes jobs in sequence order (flush relies on it).
                return self._finisher.submit(job)
        except BaseException:
            self._finisher.give_back_slot()
            raise

    def _report_finished(
        self, job: FinishJob, fields: dict[str, Any], digests: tuple[str, ...] | None
    ) -> CheckpointReport:
        # Called on the finisher thread once the job's files are durable (and hashed).
        if self._closed:
            raise ReporterClosed("report() after close()")
        with self._gate.closed():
            built = finished_report(
                # As the launch that saved it, which may be an earlier one (a recovered job).
                replace(self.config, launch_id=job.launch_id),
                fields,
                [f.name for f in job.files],
                list_files=job.list_files,
                digests=digests,
                run_attempt=job.run_attempt,
                world_size=job.world_size,
            )
            return self._spool_built(*built)

    # -- the launch ------------------------------------------------------------------------------

    @property
    def launch(self) -> Launch | None:
        """The launch this process reports as, once begun (by the restart call, or the first
        report); None before."""
        return self._launch

    def begin_launch(self, launch: Launch) -> None:
        """Report as ``launch`` from now on (the restart call numbers it for every rank).

        Raises ``ReporterConfigError`` when this process already reports as another launch (a
        report came before the restart call: call ``resume()`` first).
        """
        with self._launch_lock:
            current = self._launch
            if current is not None:
                if (current.run_attempt, current.launch_id) == (
                    launch.run_attempt,
                    launch.launch_id,
                ):
                    return
                raise ReporterConfigError(
                    "run_attempt",
                    f"this process already reports as attempt {current.run_attempt} (numbered "
                    f"by {current.how}): call resume() before the first report",
                )
            self._set_launch(launch)
            # Recorded now, not with the first report: a launch that dies before it reports
            # anything must still be numbered above (the restart call is no training step).
            self._record_now()

    def _begin_launch_here(self) -> None:
        """Begin the launch at the first report of a process whose restart call did not."""
        with self._launch_lock:
            if self._launch is not None:
                return
            cfg = self.config
            launch = begin_here(
                cfg.job_id,
                cfg.run_attempt,
                world_size=cfg.world_size,
                attempt_given=self._attempt_given,
                recorded=self.recorded_attempt,
            )
            if launch is None:
                # Ranks that share no process group cannot agree on a launch: they report as
                # the launcher numbered them, unguarded, as before launches (docs/DESIGN.md).
                self._launch = Launch(cfg.run_attempt, None, "launcher")
                return
            self._set_launch(launch)

    def _record_now(self) -> None:
        """Write the launch begun and not yet recorded beside the spool (durably), once: the
        first reports of a launch can be spooled from several threads at once (async saves'
        callbacks, the finisher), and only one of them may write the record."""
        with self._record_lock:
            unrecorded, cfg = self._unrecorded, self.config
            if unrecorded is None:
                return
            try:
                record(cfg.spool_dir / cfg.job_id, cfg.rank, unrecorded)
            except OSError as exc:
                where = str(cfg.spool_dir / cfg.job_id)
                raise SpoolUnwritable(where, exc.errno or errno.EIO, str(exc)) from exc
            self._unrecorded = None

    def _set_launch(self, launch: Launch) -> None:
        # Under _launch_lock; recorded with its first report (_spool_built).
        cfg = self.config
        self._unrecorded = launch
        self._sender.set_launch(launch.run_attempt, launch.launch_id)
        self.config = replace(cfg, run_attempt=launch.run_attempt, launch_id=launch.launch_id)
        self._launch = launch
        self._log.info(
            "launch: run_attempt %s (numbered by %s), launch id %s",
            launch.run_attempt,
            launch.how,
            launch.launch_id,
        )

    def _recover_jobs(self) -> None:
        """Queue the jobs an earlier process saved and did not finish; drop those whose files
        are gone or changed (the checkpoint was removed or overwritten since)."""
        recover_jobs(self._finisher, self._log)

    def send_restart_record(self, record: RestartRecord) -> None:
        """Spool a restart record (fsync'd), sent like a report: the restart's rank 0 calls this
        once the ranks restored (:mod:`trainer_client.restart.resume`)."""
        if self._closed:
            raise ReporterClosed("send_restart_record() after close()")
        from ckpt_contract.restart import encode_restart  # once per launch: not at import

        body = encode_restart(record)
        with self._gate.closed():
            self._spool.append(body, step=None)
            self._counters.reported += 1
            self._sender.wake()

    def step_began(self) -> None:
        """A training step started (the integrations call this; with ``step_pause_s`` the
        finisher waits, up to that long per slice, for :meth:`step_ended`)."""
        self._training_steps.began()

    def step_ended(self) -> None:
        """The training step announced by :meth:`step_began` ended."""
        self._training_steps.ended()

    def __enter__(self) -> CheckpointReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except Exception:
            if exc is None:
                raise
            # Never hide the training loop's own exception behind a shutdown problem.
            self._log.exception("error while closing the reporter")

    # -- health --------------------------------------------------------------------------------

    @property
    def acknowledged(self) -> frozenset[tuple[int, int]]:
        """(step, run_attempt) of every report SQS accepted from this reporter (those a previous
        process left in the spool included): a restart waits for the writer to store them."""
        return self._sender.acknowledged

    @property
    def last_error(self) -> BaseException | None:
        """The latest send failure; None again after a fully successful send."""
        return self._sender.last_error

    @property
    def stats(self) -> ReporterStats:
        """Counters: reported, sent, retried (entries re-tried), failed (rejected), pending;
        checkpoints finishing, dropped (rotated or changed), deferred; saves that waited at the
        ``max_finishing`` bound, and those waiting now."""
        c, f = self._counters, self._finisher
        return ReporterStats(
            c.reported,
            c.sent,
            c.retried,
            c.failed,
            self.pending,
            c.sender_cpu_s,
            finishing=f.in_flight,
            finish_dropped=f.dropped,
            finish_deferred=f.deferred,
            finish_waits=f.waits,
            saves_waiting=f.waiting,
        )

    @property
    def spool_path(self) -> str:
        """The spool file of this job and rank."""
        return str(self._spool.path)

    @property
    def spot_interruption(self) -> dict[str, Any] | None:
        """The EC2 Spot instance-action document once a notice arrived (checkpoint soon!)."""
        return self._spot.notice if self._spot is not None else None
