"""The finisher: one background thread that makes saved checkpoints durable, then reports them.

Per job, in order: check each file is still the one saved (inode, size, mtime); fsync it; rename
a staged file into place; fsync the directories up to the checkpoint's base and its parent, then
the job record (written without fsync by the training thread); hash
the files in parallel when asked; run the post-steps (an upload, say); check the files once
more; report; remove the job record. A file gone or changed at any check is a checkpoint rotated
away (``save_total_limit``, ``save_top_k``) or overwritten: never reported, a warning and
``stats.finish_dropped``. A job the finisher cannot complete now (close's deadline, a post-step's
transient failure, a full spool) stays on disk and is finished at the next start.

Post-steps (an upload, say) are in :mod:`trainer_client.finish.post_step`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from ckpt_contract import CheckpointReport, InvalidMessage
from trainer_client.config import Priority, Tuning
from trainer_client.exceptions import DropCheckpoint, FinishDeferred, ReporterError
from trainer_client.finish._pacing import (
    IdleCores,
    Pacer,
    StepSignal,
    drop_from_cache,
    lower_thread_priority,
    thread_nice,
)
from trainer_client.finish.finish_job import FinishJob, JobStore
from trainer_client.finish.post_step import FinishingJob, PostStep, run_post_steps
from trainer_client.storage.durable import (
    FileIdentity,
    fsync_dir,
    fsync_in_slices,
    parents_up_to,
    sha256_files,
)


@dataclass(frozen=True)
class FinishOutcome:
    """How a finish job ended: reported, dropped for good, or deferred to the next start."""

    status: Literal["reported", "dropped", "deferred"]
    step: int
    report: CheckpointReport | None = None
    reason: str = ""
    # Where a reported job's time went, in seconds: "queued" (behind earlier jobs), "durable"
    # (the files' write-back and fsync, the directories, the record), "hash", "post" (the
    # post-steps), "report" (the last identity check and the spool's append).
    seconds: Mapping[str, float] = field(default_factory=dict)


ReportFn = Callable[[FinishJob, dict[str, Any], tuple[str, ...] | None], CheckpointReport]


class _Dropped(Exception):
    pass


_Queued = tuple[FinishJob, Future[FinishOutcome], float]  # the job, its future, submitted at


class _PhaseClock:
    """Writes the seconds since the previous lap under each phase's name."""

    def __init__(self, into: dict[str, float]) -> None:
        self._into, self._last = into, time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self._into[phase] = now - self._last
        self._last = now


class Finisher(threading.Thread):
    """Finishes jobs oldest first; at most ``max_in_flight`` submitted and not yet done."""

    def __init__(
        self,
        *,
        store: JobStore,
        report: ReportFn,
        post_steps: Mapping[str, PostStep],
        tuning: Tuning,
        training_steps: StepSignal,
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        super().__init__(name=f"ckpt-finisher-{store.directory.name}", daemon=True)
        self._store, self._report, self._steps, self._log = store, report, post_steps, log
        self._max_in_flight, self._tuning = tuning.max_finishing, tuning
        self._training_steps = training_steps
        self._idle_cores = IdleCores()
        # The training's nice (built on its thread): every finisher thread is set relative to it.
        self._base_nice = thread_nice()
        self._queue: queue.SimpleQueue[_Queued | None] = queue.SimpleQueue()
        self._slots = threading.Condition()
        self._in_flight = 0
        self._done_through = -1  # every job with seq <= this one has an outcome
        self._stopping = threading.Event()
        self.dropped = 0
        self.deferred = 0
        self.waits = 0
        self.waiting = 0

    # -- the submitting side (training thread) ----------------------------------------------

    def take_slot(self) -> float:
        """Wait for room under the bound; returns the seconds waited (0.0 when none)."""
        with self._slots:
            if self._in_flight < self._max_in_flight:
                self._in_flight += 1
                return 0.0
            start = time.monotonic()
            self.waiting += 1
            try:
                self._slots.wait_for(lambda: self._in_flight < self._max_in_flight)
            finally:
                self.waiting -= 1
            self._in_flight += 1
            self.waits += 1
            return time.monotonic() - start

    def give_back_slot(self) -> None:
        """Release a slot taken for a job that was not submitted after all."""
        with self._slots:
            self._in_flight -= 1
            self._slots.notify_all()

    def submit(self, job: FinishJob, *, recovered: bool = False) -> Future[FinishOutcome]:
        """Queue a job whose record is on disk; a recovered one takes a slot beyond the bound."""
        if recovered:
            with self._slots:
                self._in_flight += 1
        future: Future[FinishOutcome] = Future()
        self._queue.put((job, future, time.monotonic()))
        return future

    def drop_unsubmitted(self, seq: int) -> None:
        """Count a recovered job dropped before it was queued (its files are not intact)."""
        with self._slots:
            self.dropped += 1
            self._done_through = max(self._done_through, seq)
            self._slots.notify_all()

    @property
    def store(self) -> JobStore:
        """The job records this finisher works through."""
        return self._store

    @property
    def in_flight(self) -> int:
        """Jobs submitted and not yet finished, dropped or deferred."""
        return self._in_flight

    def wait_done(self, seq: int, timeout: float) -> bool:
        """Wait until every job up to ``seq`` has an outcome; False at the deadline."""
        with self._slots:
            return self._slots.wait_for(lambda: self._done_through >= seq, timeout=timeout)

    def stop(self) -> None:
        """Ask the thread to stop: the job in hand is deferred at its next check, the queued
        ones stay on disk (join to wait)."""
        self._stopping.set()
        self._queue.put(None)

    # -- the finishing thread ------------------------------------------------------------------

    def run(self) -> None:
        """Take jobs oldest first until stopped; never raises out of the loop."""
        self._lower_priority()
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, future, submitted = item
            outcome = self._finish_one(job, time.monotonic() - submitted)
            if outcome.status != "deferred" and self._tuning.drop_page_cache:
                # Clean pages now (fsync'd): give them back, not evict the training's data.
                drop_from_cache(f.path for f in job.files)
            # The next job's idle cores are measured from here: training alone.
            self._idle_cores.restart()
            with self._slots:
                self._in_flight -= 1
                self._done_through = max(self._done_through, job.seq)
                self._slots.notify_all()
            future.set_result(outcome)
            if self._stopping.is_set():
                self._defer_queued(outcome)
                return

    def _defer_queued(self, last: FinishOutcome) -> None:
        """Stopped: the jobs still queued stay on disk; each one's future says so and why
        (the job in hand when the reporter closed, and what held it), so that a caller waiting
        on them (the callbacks' one line per checkpoint) learns of every checkpoint left."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                continue
            job, future, _ = item
            self.deferred += 1
            held = f"step {last.step} {last.status}" + (f": {last.reason}" if last.reason else "")
            reason = (
                f"the reporter closed before its turn ({held}); its job stays in"
                f" {self._store.directory} for the next start or `ckpt-pipeline spool send`"
            )
            self._store.note_deferred(job.seq, reason)
            with self._slots:
                self._in_flight -= 1
                self._done_through = max(self._done_through, job.seq)
                self._slots.notify_all()
            future.set_result(FinishOutcome("deferred", job.step, reason=reason))

    def _finish_one(self, job: FinishJob, queued_s: float) -> FinishOutcome:
        seconds = {"queued": queued_s}
        try:
            if self._stopping.is_set():
                raise FinishDeferred("the reporter is closing")
            report = self._finish(job, seconds)
        except _Dropped as exc:
            self.dropped += 1
            self._log.warning("checkpoint of step %s not reported: %s", job.step, exc)
            # The library's logger has only a NullHandler: a checkpoint left without its record
            # must reach the user's stderr even when nobody configured logging (STYLE.md).
            warnings.warn(
                f"checkpoint of step {job.step} not reported: {exc}", RuntimeWarning, stacklevel=1
            )
            self._store.remove(job.seq)
            return FinishOutcome("dropped", job.step, reason=str(exc))
        except (FinishDeferred, ReporterError, OSError) as exc:
            self.deferred += 1
            self._log.warning(
                "checkpoint of step %s not finished now (%s); its job stays in %s for the next "
                "start",
                job.step,
                exc,
                self._store.directory,
            )
            self._store.note_deferred(job.seq, str(exc))
            return FinishOutcome("deferred", job.step, reason=str(exc))
        except Exception as exc:
            # A bug or a post-step's own failure: the job stays on disk, the thread lives on.
            self.deferred += 1
            self._log.exception("finishing step %s failed; its job stays on disk", job.step)
            self._store.note_deferred(job.seq, repr(exc))
            return FinishOutcome("deferred", job.step, reason=repr(exc))
        self._store.remove(job.seq)
        return FinishOutcome("reported", job.step, report=report, seconds=seconds)

    def _lower_priority(self) -> None:
        priority = cast(Priority, self._tuning.finisher_priority)  # validated by Tuning
        lower_thread_priority(priority, self._tuning.finisher_nice, self._base_nice)

    def _pacer(self) -> Pacer:
        return Pacer(
            max_bandwidth=self._tuning.max_bandwidth,
            step_pause_s=self._tuning.step_pause_s,
            steps=self._training_steps,
            stop=self._stopping,
        )

    def _finish(self, job: FinishJob, seconds: dict[str, float]) -> CheckpointReport:
        """Finish one job; ``seconds`` gets the time of each phase (FinishOutcome.seconds)."""
        clock = _PhaseClock(seconds)
        paths = tuple(Path(f.path) for f in job.files)
        pacer = self._pacer()
        threads = self._tuning.hash_threads or self._idle_cores.take()
        for f in job.files:
            current = f.current_path()
            self._check_identity(f.name, current, f.identity)
            try:
                fsync_in_slices(
                    current,
                    self._tuning.writeback_slice_bytes,
                    pacer,
                    should_stop=self._stopping.is_set,
                )
            except InterruptedError:
                raise FinishDeferred("the reporter is closing") from None
            except FileNotFoundError:
                raise _Dropped(f"{f.name} was removed while being finished (rotated?)") from None
            except OSError as exc:
                # After a failed fsync the kernel may have dropped the dirty pages: a later
                # fsync can succeed on lost data, so this checkpoint is never reported.
                raise _Dropped(f"fsync of {f.name} failed: {exc}") from None
            if f.staged is not None and current == f.staged:
                Path(f.staged).replace(f.path)
        try:
            for directory in parents_up_to(paths, Path(job.base)):
                fsync_dir(directory)
        except FileNotFoundError:
            raise _Dropped(f"{job.base} was removed while being finished (rotated?)") from None
        except OSError as exc:
            raise _Dropped(f"fsync of a directory of {job.base} failed: {exc}") from None
        # The record with the files: a crash from here on finishes the job at the next start.
        self._store.persist(job.seq)
        clock.lap("durable")
        sizes = tuple(f.identity.size for f in job.files)
        digests = self._hash(paths, pacer, threads) if job.checksums else None
        clock.lap("hash")
        context = FinishingJob(
            job, paths, sizes, digests, self._store.state_dir(job.seq), self._stopping.is_set
        )
        try:
            updates = run_post_steps(context, self._steps, self._stopping, self._log)
        except DropCheckpoint as exc:
            raise _Dropped(str(exc)) from None
        clock.lap("post")
        # Rotation after the fsync or while hashing (an open file can still be read after its
        # name is gone): the last look before the report.
        for f, path in zip(job.files, paths, strict=True):
            self._check_identity(f.name, str(path), f.identity)
        report = self._report_fields(job, sizes, digests, updates)
        clock.lap("report")
        return report

    def _check_identity(self, name: str, path: str, saved: FileIdentity) -> None:
        try:
            now = FileIdentity.of(path)
        except FileNotFoundError:
            raise _Dropped(f"{name} was removed before it was finished (rotated?)") from None
        if now != saved:
            raise _Dropped(f"{name} changed since it was saved ({saved} -> {now})")

    def _hash(self, paths: tuple[Path, ...], pacer: Pacer, threads: int) -> tuple[str, ...]:
        pool = ThreadPoolExecutor(
            max_workers=max(1, min(threads, len(paths))),
            thread_name_prefix="ckpt-sha256",
            initializer=self._lower_priority,
        )
        try:
            return tuple(
                sha256_files(
                    paths, executor=pool, should_stop=self._stopping.is_set, after_chunk=pacer
                )
            )
        except FileNotFoundError:
            raise _Dropped("a file was removed before it was hashed (rotated?)") from None
        except InterruptedError:
            raise FinishDeferred("the reporter is closing") from None
        except OSError as exc:
            raise _Dropped(f"a file cannot be read back to hash it: {exc}") from None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _report_fields(
        self,
        job: FinishJob,
        sizes: tuple[int, ...],
        digests: tuple[str, ...] | None,
        updates: Mapping[str, Any],
    ) -> CheckpointReport:
        fields = dict(job.fields)
        extra = {**(fields.pop("extra", None) or {}), **updates.get("extra", {})}
        fields.update({k: v for k, v in updates.items() if k != "extra"})
        fields["bytes"] = sum(sizes)
        fields["sha256"] = digests[0] if digests is not None and len(digests) == 1 else None
        try:
            # Built once, with the file list (or its count) by _finish_request.finished_report.
            return self._report(job, {**fields, "extra": extra}, digests)
        except InvalidMessage as exc:
            raise _Dropped(f"its report is invalid: {exc}") from None
