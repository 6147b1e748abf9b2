"""The background sender: spool → SendMessageBatch, with acks, retries and backoff."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckpt_contract import InvalidMessage, decode, dedup_id, group_id
from ckpt_contract.kinds import is_restart_body
from trainer_client.exceptions import EntryRejected
from trainer_client.report._gate import DiskGate, bind_to_current_thread, install_checkpoints
from trainer_client.report._retry import (
    ENTRY_CODES,
    Failure,
    backoff_delay,
    classify_failure,
    error_code,
    split_results,
)
from trainer_client.report._wake import Waker
from trainer_client.report.spool import PendingRecord, Spool

# While someone waits in flush(), retry at least this often so the deadline is used.
_FLUSH_RETRY_CAP_S = 0.5
_throttling_entry_codes = frozenset({"ThrottlingException", "RequestThrottled", "Throttling"})


def send_entry(seq: int, body: str, *, group: str, dedup: str) -> dict[str, str]:
    """The ``SendMessageBatch`` entry of one spooled report: its spool sequence is the entry's
    Id (the answer acks that record), its group and deduplication id the contract's."""
    return {
        "Id": str(seq),
        "MessageBody": body,
        "MessageGroupId": group,
        "MessageDeduplicationId": dedup,
    }


def _is_rejection(error: BaseException | None) -> bool:
    return isinstance(error, EntryRejected) and error.sender_fault


@dataclass
class Counters:
    """Mutable counters; each is written by one thread only (GIL-atomic increments)."""

    reported: int = 0
    sent: int = 0
    retried: int = 0
    failed: int = 0
    sender_cpu_s: float = 0.0


class Sender(threading.Thread):
    """Sends spooled records oldest-first until stopped; never raises out of its loop."""

    def __init__(
        self,
        *,
        spool: Spool,
        client: Any,
        queue_url: str,
        job_id: str,
        run_attempt: int,
        rank: int,
        batch_size: int,
        backoff_base_s: float,
        backoff_cap_s: float,
        backlog_warning_interval_s: float,
        counters: Counters,
        waker: Waker,
        gate: DiskGate,
        progress: threading.Condition,
        log: logging.LoggerAdapter[logging.Logger],
        on_signal: Callable[[], None],
    ) -> None:
        super().__init__(name=f"ckpt-sender-{spool.path.name}", daemon=True)
        self._spool, self._client, self._queue_url = spool, client, queue_url
        # Every report this process spools has this job, attempt and rank (report() refuses
        # them as extras): with the step, they give the SQS ids here, off report()'s path.
        self._job_id, self._run_attempt, self._rank = job_id, run_attempt, rank
        self._launch_id: str | None = None
        self._group_id = group_id(job_id, rank)
        self._batch_size = batch_size
        self._base, self._cap = backoff_base_s, backoff_cap_s
        self._warn_interval = backlog_warning_interval_s
        self._counters, self._waker, self._progress, self._log = counters, waker, progress, log
        # Steps aside while a report() is in progress: checkpoints in this loop and on the
        # client's botocore events (see _gate.py for why).
        self._gate = gate
        install_checkpoints(client)
        self._on_signal = on_signal
        self._rng = random.Random()
        self._last_warning = float("-inf")
        self.last_error: BaseException | None = None
        self.rejected_any = False
        # SQS has accepted an entry from this sender: the queue, the credentials and the rights
        # work, so a request refused with only one entry in it is that entry's doing.
        self._accepted_any = False
        # Set only through the methods below (a signal handler's among them, which is why they
        # are plain flags and not a queue: a handler must not take a lock).
        self._urgent = False
        self._signal_pending = False
        self._stopping = False
        # flush() runs on several threads at once (caller, SIGTERM and Spot flushes): a lock.
        self.flush_waiters = 0
        self._waiters_lock = threading.Lock()
        # (step, run_attempt) of every report SQS accepted from this sender, recovered ones
        # included: what a restart's resume waits to see written (trainer_client.restart).
        self._identity: dict[int, tuple[int, int]] = {}
        self._acknowledged: set[tuple[int, int]] = set()
        self._acknowledged_lock = threading.Lock()

    # -- what other threads ask of the sender ---------------------------------------------------

    @property
    def acknowledged(self) -> frozenset[tuple[int, int]]:
        """(step, run_attempt) of the reports SQS has accepted from this process."""
        with self._acknowledged_lock:
            return frozenset(self._acknowledged)

    def set_launch(self, run_attempt: int, launch_id: str | None) -> None:
        """The attempt and launch of the reports this process spools from now on (set before the
        first of them is appended, so the sender never sees one of them without it)."""
        self._run_attempt, self._launch_id = run_attempt, launch_id

    def add_flush_waiter(self, delta: int) -> None:
        """Count a flush() starting (+1) or ending (-1)."""
        with self._waiters_lock:
            self.flush_waiters += delta

    def wake(self) -> None:
        """New records are on disk: send them (from any thread)."""
        self._waker.wake()

    def hurry(self) -> None:
        """Cut the current backoff short and send now (a flush, a Spot notice)."""
        self._urgent = True
        self._waker.wake()

    def signal_received(self) -> None:
        """From a signal handler: flags and one write(2), no locks; handled on this thread."""
        self._signal_pending = True
        self._urgent = True
        self._waker.wake_from_signal()

    def take_unhandled_signal(self) -> bool:
        """Whether a signal arrived that the loop did not handle (then it is now handled)."""
        pending, self._signal_pending = self._signal_pending, False
        return pending

    def stop(self) -> None:
        """Leave the loop after the send in progress (join to wait for it)."""
        self._stopping = True
        self._waker.wake()

    def run(self) -> None:
        """The loop: send a batch, back off on failure, sleep when idle."""
        attempt = 0
        bind_to_current_thread(self._gate)
        while not self._stopping:
            self._counters.sender_cpu_s = time.thread_time()
            if self.take_unhandled_signal():
                self._on_signal()
            try:
                self._gate.checkpoint()
                batch = self._spool.peek(self._batch_size)
                if not batch:
                    self._waker.wait(None)
                    continue
                ok = self._send(batch)
            except OSError as exc:
                # Disk trouble reading the spool (EIO): not an SQS problem, say so.
                self._log.warning("cannot read the spool %s (%s); retrying", self._spool.path, exc)
                self.last_error = exc
                ok = False
            except Exception as exc:
                # A bug: the thread must survive it, or reports stop flowing silently. The
                # records stay on disk; the backoff keeps this from spinning.
                self._log.exception("sender error; retrying")
                self._failed(exc, Failure.CONFIGURATION, 0)
                ok = False
            if ok:
                attempt = 0
                continue
            self._sleep(backoff_delay(attempt, base_s=self._base, cap_s=self._cap, rng=self._rng))
            attempt += 1
        self._counters.sender_cpu_s = time.thread_time()

    def _sleep(self, delay: float) -> None:
        start = time.monotonic()
        while not (self._stopping or self._urgent or self._signal_pending):
            limit = min(delay, _FLUSH_RETRY_CAP_S) if self.flush_waiters else delay
            remaining = start + limit - time.monotonic()
            if remaining <= 0:
                break
            self._waker.wait(remaining)
        self._urgent = False

    def _entries(self, batch: list[PendingRecord]) -> list[dict[str, str]]:
        entries = []
        for record in batch:
            # Spooled by this process: the step gives the ids, no need to parse (pydantic) a body
            # that is only forwarded. Recovered from disk: decoded and checked as before.
            if record.step is not None:
                ids = (
                    self._group_id,
                    dedup_id(
                        self._job_id, self._run_attempt, record.step, self._rank, self._launch_id
                    ),
                )
                self._identity[record.seq] = (record.step, self._run_attempt)
            else:
                try:
                    ids, identity = _recovered_ids(record.body)
                except InvalidMessage as exc:
                    # Spooled by an older/newer client version the contract no longer accepts.
                    self._reject(record, "InvalidMessage", str(exc))
                    continue
                if identity is not None:
                    self._identity[record.seq] = identity
            entries.append(send_entry(record.seq, record.body, group=ids[0], dedup=ids[1]))
        return entries

    def _send(self, batch: list[PendingRecord]) -> bool:
        entries = self._entries(batch)
        sent = self._send_entries(entries, {r.seq: r for r in batch}) if entries else True
        self._notify()
        return sent

    def _send_entries(
        self, entries: list[dict[str, str]], by_seq: dict[int, PendingRecord]
    ) -> bool:
        """One SendMessageBatch; True when nothing of ``entries`` is left to retry."""
        try:
            response = self._client.send_message_batch(QueueUrl=self._queue_url, Entries=entries)
        except Exception as exc:
            kind = classify_failure(exc)
            if kind is Failure.REFUSED:
                return self._isolate(entries, by_seq, exc)
            self._failed(exc, kind, len(entries))
            return False
        ok, failed = split_results(response)
        # Listed before the spool lets go of them: flush() returns once the spool is empty, and
        # a restart reads `acknowledged` right after it.
        with self._acknowledged_lock:
            for entry_id in ok:
                identity = self._identity.pop(int(entry_id), None)
                if identity is not None:
                    self._acknowledged.add(identity)
        self._gate.checkpoint()  # ack() takes the spool lock, which report()'s append holds
        self._spool.ack([int(i) for i in ok])
        self._counters.sent += len(ok)
        self._accepted_any = self._accepted_any or bool(ok)
        retry = False
        for entry in failed:
            seq, code = int(entry["Id"]), str(entry.get("Code", ""))
            error = EntryRejected(
                seq,
                code,
                str(entry.get("Message", "")),
                sender_fault=bool(entry.get("SenderFault")),
            )
            if error.sender_fault and code not in _throttling_entry_codes:
                self._reject(by_seq[seq], code, str(error))
            else:
                retry = True
                self._failed(error, Failure.UNREACHABLE, 1)
        if not failed and not _is_rejection(self.last_error):
            # A later success clears a transient error, never a report set aside for good: that
            # stays visible (with stats.failed and the .rejected file) for the operator.
            self.last_error = None
        return not retry

    def _isolate(
        self, entries: list[dict[str, str]], by_seq: dict[int, PendingRecord], exc: BaseException
    ) -> bool:
        """The whole request was refused: halve it until the refused entry stands alone.

        Both halves are always sent, so the valid neighbours of a bad entry go through in the
        same round (at most 2·log2(10) ≈ 7 extra calls for one bad entry in ten).
        """
        if len(entries) > 1:
            middle = len(entries) // 2
            first = self._send_entries(entries[:middle], by_seq)
            second = self._send_entries(entries[middle:], by_seq)
            return first and second
        code = error_code(exc)
        if code in ENTRY_CODES or self._accepted_any:
            self._reject(by_seq[int(entries[0]["Id"])], code, f"refused on its own: {exc}")
            return True
        # Alone, refused with a code that could be about the call, and nothing accepted yet to
        # tell the entry from the queue: keep it and retry, loudly, as configuration.
        self._failed(exc, Failure.CONFIGURATION, 1)
        return False

    def _reject(self, record: PendingRecord, code: str, reason: str) -> None:
        # A record that passed our validation and that SQS still refuses is a bug (ours or a
        # limit changed): keep it on disk in the .rejected file and count it, but never let it
        # block this rank's later reports forever.
        self._spool.reject(record.seq, record.body, f"{code}: {reason}")
        self._identity.pop(record.seq, None)
        self._counters.failed += 1
        self.rejected_any = True
        self.last_error = EntryRejected(record.seq, code, reason, sender_fault=True)
        self._log.error(
            "record %s can never be sent (%s); set aside in %s",
            record.seq,
            reason,
            self._spool.rejected_path,
        )

    def _failed(self, exc: BaseException, kind: Failure, entries: int) -> None:
        self.last_error = exc
        self._counters.retried += entries
        now = time.monotonic()
        if now - self._last_warning >= self._warn_interval:
            self._last_warning = now
            self._log.warning(
                "cannot send to SQS (%s: %s); %s report(s) pending on disk in %s, retrying",
                kind.value,
                exc,
                self._spool.pending_count,
                self._spool.path,
            )
        else:
            self._log.debug("send failed (%s: %s)", kind.value, exc)

    def _notify(self) -> None:
        with self._progress:
            self._progress.notify_all()


def _recovered_ids(body: str) -> tuple[tuple[str, str], tuple[int, int] | None]:
    """(group, dedup id) of a body read back from the spool, and the (step, run_attempt) a
    restart waits for when it is a report (a restart record is not one: its own group and
    identity). Raises ``InvalidMessage``."""
    if is_restart_body(body):
        from ckpt_contract.restart import decode_restart  # rare: not at the client's import

        restart = decode_restart(body)
        return (restart.group_id, restart.dedup_id), None
    report = decode(body)
    return (report.group_id, report.dedup_id), (report.step, report.run_attempt)
