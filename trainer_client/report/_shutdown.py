"""How a reporter stops without losing a report: flush, close, and the preemption notices.

:class:`ReporterShutdown` is the half of :class:`~trainer_client.CheckpointReporter` that waits:
``flush()`` until what was saved is finished and acknowledged, ``close()`` within its deadline
(async saves, the finisher, the sender, in that order; what is left stays on disk for the next
start), and the SIGTERM and Spot notices that flush early. ``reporter.py`` keeps the reporter's
construction and the training loop's calls (``report``, ``finish``, the step signals, health).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from trainer_client._log import JobRankAdapter, warn_visibly
from trainer_client.config import ReporterConfig
from trainer_client.finish.finish_job import JobStore
from trainer_client.finish.finisher import Finisher
from trainer_client.report._retry import Failure, classify_failure
from trainer_client.report._wake import Waker
from trainer_client.report.sender import Sender
from trainer_client.report.signals import SigtermChain
from trainer_client.report.spool import Spool
from trainer_client.report.spot import SpotPoller

DEFAULT_FLUSH_TIMEOUT_S = 30.0
# A thread still running after close() gave it its share of the deadline is left behind (it is a
# daemon): at least this long, so that a close(timeout=0) still lets a quiet thread exit.
_MIN_JOIN_S = 1.0
# close() re-checks, this often, whether the sender's failure is one only an operator fixes.
_CLOSE_SLICE_S = 1.0


class ReporterShutdown:
    """Flush, close and preemption (see the module); ``CheckpointReporter`` sets these."""

    config: ReporterConfig
    _log: JobRankAdapter
    _spool: Spool
    _sender: Sender
    _finisher: Finisher
    _jobs: JobStore
    _waker: Waker
    _progress: threading.Condition
    _saves: threading.Condition
    _pending_saves: int
    _closed: bool
    _sigterm: SigtermChain
    _spot: SpotPoller | None

    def flush(self, timeout: float = DEFAULT_FLUSH_TIMEOUT_S) -> bool:
        """Wait until every checkpoint saved so far is finished and every report acknowledged by
        SQS; False at the deadline (what is left stays on disk)."""
        deadline = time.monotonic() + timeout
        if not self._finisher.wait_done(self._jobs.last_seq, timeout):
            return False
        target = self._spool.last_seq
        self._sender.add_flush_waiter(1)
        self._sender.hurry()
        try:
            with self._progress:
                while True:
                    oldest = self._spool.oldest_pending_seq()
                    if oldest is None or oldest > target:
                        # A checkpoint left for the next start is not reported: not flushed.
                        return not (self._sender.rejected_any or self._finisher.deferred)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._sender.is_alive():
                        return False
                    self._progress.wait(min(remaining, 0.5))
        finally:
            self._sender.add_flush_waiter(-1)

    def close(self, timeout: float | None = None) -> bool:
        """Wait for async saves, finishing and the flush, together for at most ``timeout``
        (default close_timeout_s); stop; leave the rest on disk for the next start."""
        if self._closed:
            return self.pending == 0
        budget = self.config.tuning.close_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + budget
        with self._saves:
            # A checkpoint saved after the training loop ended must still be reported.
            self._saves.wait_for(
                lambda: self._pending_saves == 0, timeout=max(0.0, deadline - time.monotonic())
            )
            saves_left = self._pending_saves
        flushed = self._flush_at_close(deadline)
        self._closed = True
        if self._spot is not None:
            self._spot.stop()
        unfinished = self._finisher.in_flight
        self._stop_thread(self._finisher, self._finisher.stop, deadline)
        # Bounded: a send in progress ends within the botocore timeouts; the thread is a daemon.
        self._stop_thread(self._sender, self._sender.stop, deadline)
        self._sigterm.uninstall()
        if self._sender.take_unhandled_signal():
            # A SIGTERM arrived while closing, too late for the sender to handle it: deliver it
            # again now that the previous handler is back, so it is never swallowed.
            self._sigterm.resend()
        if saves_left:
            self._log.warning("closing with %s async save(s) still unfinished", saves_left)
        if unfinished:
            warn_visibly(
                self._log,
                "closing with %s saved checkpoint(s) not finished; kept in %s: the next start of"
                " this job and rank finishes them, or `ckpt-pipeline spool send --dir %s`",
                unfinished,
                self._jobs.directory,
                self.config.spool_dir,
            )
        left = self._spool.pending_count
        if left:
            error = self._sender.last_error
            warn_visibly(
                self._log,
                "closing with %s report(s) unsent (%s); kept in %s: the next start of this job"
                " and rank sends them, or `ckpt-pipeline spool send --dir %s`",
                left,
                "the queue's last error: " + _first_line(error) if error else "not sent in time",
                self._spool.path,
                self.config.spool_dir,
            )
        self._spool.close()
        # Always: a sender still in a send (a daemon) only ever waits on the Event, which a
        # closed pipe does not affect; keeping the pipe and its watcher would leak them.
        self._waker.close()
        return flushed and not saves_left and not unfinished

    def _flush_at_close(self, deadline: float) -> bool:
        """flush() until ``deadline``, in slices; stop early when the queue is misconfigured.

        A missing queue, missing credentials or a denied permission (``Failure.CONFIGURATION``)
        will not send anything before the deadline: close() says so (the reports stay in the
        spool) instead of making the job's exit wait out close_timeout_s.
        """
        while True:
            before = self._spool.pending_count
            if self.flush(max(0.0, min(_CLOSE_SLICE_S, deadline - time.monotonic()))):
                return True
            if time.monotonic() >= deadline:
                return False
            error = self._sender.last_error
            stuck = self._spool.pending_count >= before
            if stuck and error is not None and classify_failure(error) is Failure.CONFIGURATION:
                return False

    def _stop_thread(self, thread: threading.Thread, stop: Any, deadline: float) -> None:
        """Ask ``thread`` to stop and join it until the deadline (at least _MIN_JOIN_S)."""
        wait = max(_MIN_JOIN_S, deadline - time.monotonic())
        stop()
        thread.join(timeout=wait)
        if thread.is_alive():
            self._log.warning(
                "thread %s did not stop within close()'s deadline (%.1f s); left running as a "
                "daemon, its work stays on disk for the next start",
                thread.name,
                wait,
            )

    def save_started(self) -> None:
        """An async save will call report() when it completes (see ``report_when_saved``)."""
        with self._saves:
            self._pending_saves += 1

    def save_finished(self) -> None:
        """The async save announced by :meth:`save_started` completed (reported or not)."""
        with self._saves:
            self._pending_saves -= 1
            self._saves.notify_all()

    @property
    def pending(self) -> int:
        """Reports on disk not yet acknowledged by SQS."""
        return self._spool.pending_count

    # -- preemption: flush early, then pass the signal on ---------------------------------------

    def _signal_received(self) -> None:
        # Runs inside the SIGTERM handler: the sender's flags and one write(2) only.
        self._sender.signal_received()

    def _on_sigterm(self) -> None:
        # Called on the sender thread; the flushing waits on yet another thread so that the
        # sender keeps sending meanwhile.
        threading.Thread(
            target=self._flush_then_chain, name="ckpt-sigterm-flush", daemon=True
        ).start()

    def _flush_then_chain(self) -> None:
        timeout = self.config.tuning.signal_flush_timeout_s
        start = time.monotonic()
        flushed = self.flush(timeout)
        self._log.warning(
            "SIGTERM: %s in %.2f s (%s pending); passing the signal on",
            "flushed" if flushed else "flush deadline reached",
            time.monotonic() - start,
            self.pending,
        )
        self._sigterm.resend()

    def _spot_notice(self, notice: dict[str, Any]) -> None:
        self._sender.hurry()
        threading.Thread(target=self.flush, name="ckpt-spot-flush", daemon=True).start()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
