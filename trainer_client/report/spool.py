"""The durable spool of one (job, rank): framed, fsync'd appends; an ack log; atomic compaction.

Files in ``<spool_dir>/<job_id>/``: ``rank-<r>.spool`` (reports), ``rank-<r>.acks`` (sequence
numbers SQS acknowledged), ``rank-<r>.lock`` (flock: one live owner), ``rank-<r>.rejected``
(reports SQS rejected as the sender's fault, kept for an operator). Only an index of pending
records (sequence, offset, size) lives in memory; bodies are re-read from disk when sent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from trainer_client.exceptions import SpoolFull, SpoolLocked, SpoolUnwritable
from trainer_client.report._framing import frame, scan
from trainer_client.storage.durable import fsync_dir, mkdir_durable, open_append, write_all

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingRecord:
    """A spooled report not yet acknowledged by SQS."""

    seq: int
    body: str
    # The report's step when this process appended it (with the reporter's job, attempt and
    # rank it gives the SQS ids without parsing the body); None if recovered from disk.
    step: int | None = None


class Spool:
    """Crash-safe, bounded queue of report bodies on disk; thread-safe; one owner process."""

    def __init__(
        self,
        directory: Path,
        rank: int,
        *,
        max_bytes: int,
        max_records: int,
        compact_threshold_bytes: int,
        log: logging.LoggerAdapter[logging.Logger] | None = None,
    ) -> None:
        self._log = log or logging.LoggerAdapter(_log, {})
        self.directory = directory
        mkdir_durable(self.directory)
        stem = f"rank-{rank}"
        self.path = directory / f"{stem}.spool"
        self.ack_path = directory / f"{stem}.acks"
        self.rejected_path = directory / f"{stem}.rejected"
        self.lock_path = directory / f"{stem}.lock"
        self._max_bytes = max_bytes
        self._max_records = max_records
        self._compact_threshold = compact_threshold_bytes
        # Guards the index and the append fd. report()'s append takes it, so everyone else holds
        # it only for in-memory work (and compaction), never across a read or the ack log's
        # write: a holder that loses the GIL in a syscall would make report() wait for it.
        self._lock = threading.Lock()
        # Serialises the sender's file work done outside _lock (peek's reads, ack-log writes,
        # compaction, which alone replaces the read fd) against close(). report() never takes it.
        self._io_lock = threading.Lock()
        self._steps: dict[int, int] = {}
        self._lock_fd = self._take_flock()
        self._pending: OrderedDict[int, tuple[int, int]] = OrderedDict()  # seq -> (offset, size)
        self._pending_bytes = 0
        self._garbage_bytes = 0
        self._rfd: int | None = None
        self._closed = False
        try:
            self._recover()
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _take_flock(self) -> int:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SpoolLocked(
                f"spool {self.path} is in use by another reporter (pid {holder}); "
                "one reporter per job and rank"
            ) from None
        # The kernel drops the flock when the owner dies (even by SIGKILL); the pid is for messages.
        with contextlib.suppress(OSError):  # a full disk must not stop a restart
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _recover(self) -> None:
        acks = scan(self.ack_path.read_bytes()) if self.ack_path.exists() else None
        acked = {r.seq for r in acks.records} if acks else set()
        data = scan(self.path.read_bytes()) if self.path.exists() else None
        if data and data.corrupt_regions:
            self._log.warning(
                "spool %s: skipped %s torn/corrupt bytes in %s region(s); intact records kept",
                self.path,
                data.skipped_bytes,
                data.corrupt_regions,
            )
        if acks and acks.corrupt_regions:
            self._log.warning(
                "ack log %s: skipped a torn tail (those reports are re-sent)", self.ack_path
            )
        records = data.records if data else []
        seqs = [r.seq for r in records] + sorted(acked)
        self._next_seq = max(seqs, default=-1) + 1
        for record in records:
            if record.seq not in acked and record.seq not in self._pending:
                self._pending[record.seq] = (record.offset, record.size)
                self._pending_bytes += record.size
        self._fd = open_append(self.path)
        self._end = os.fstat(self._fd).st_size
        self._ack_fd = open_append(self.ack_path)
        self._garbage_bytes = self.path.stat().st_size - self._pending_bytes
        if self._garbage_bytes or acked:
            with self._lock:
                self._compact_locked()  # at open: a clean file; skipped when the disk refuses
        if self._pending:
            self._log.info(
                "spool %s: %s unacknowledged report(s) to re-send", self.path, len(self._pending)
            )

    @property
    def pending_count(self) -> int:
        """Reports spooled and not yet acknowledged."""
        return len(self._pending)

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest spooled record (-1 if none ever)."""
        return self._next_seq - 1

    def oldest_pending_seq(self) -> int | None:
        """The smallest pending sequence number, or None when everything is acknowledged."""
        with self._lock:
            return next(iter(self._pending), None)

    def append(self, body: str, *, step: int | None = None) -> int:
        """Append one body durably (write + fsync) and return its sequence number.

        ``step`` is kept in memory with the record for :meth:`peek` (not on disk: a recovered
        record's body is decoded instead).
        """
        payload = body.encode()
        with self._lock:
            if self._closed:
                raise ValueError(f"spool {self.path} is closed")
            if len(self._pending) >= self._max_records:
                raise SpoolFull(
                    f"{len(self._pending)} reports pending (max_pending_records); "
                    "SQS unreachable for long?"
                )
            record = frame(self._next_seq, payload)
            if self._pending_bytes + len(record) > self._max_bytes:
                raise SpoolFull(
                    f"{self._pending_bytes} B pending + {len(record)} B exceeds max_spool_bytes "
                    f"{self._max_bytes}; SQS unreachable for long?"
                )
            offset = self._end
            try:
                write_all(self._fd, record)
                os.fsync(self._fd)
            except OSError as exc:
                # A partial write is a torn record: cut it so later appends stay readable; the
                # caller is told the report is not durable (it is not counted as spooled).
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, offset)
                with contextlib.suppress(OSError):
                    # If the cut failed too, the torn bytes stay (recovery skips them); the
                    # next record's offset must still be where O_APPEND will put it.
                    self._end = os.fstat(self._fd).st_size
                raise SpoolUnwritable(
                    str(self.path), exc.errno or errno.EIO, f"{self.path}: {exc.strerror or exc}"
                ) from exc
            seq = self._next_seq
            self._next_seq += 1
            self._end = offset + len(record)
            self._pending[seq] = (offset, len(record))
            self._pending_bytes += len(record)
            if step is not None:
                self._steps[seq] = step
            return seq

    def peek(self, limit: int) -> list[PendingRecord]:
        """Up to ``limit`` oldest pending records, read back from disk."""
        with self._io_lock:
            with self._lock:
                if self._closed:
                    return []
                index = [
                    (seq, offset, size, self._steps.get(seq))
                    for seq, (offset, size) in itertools.islice(self._pending.items(), limit)
                ]
            # The reads need only _io_lock: appends never move existing bytes, and compaction,
            # the one thing that does, holds _io_lock too.
            rfd = self._fd_read()
            raws = [(seq, os.pread(rfd, size, offset), ids) for seq, offset, size, ids in index]
        out = []
        for seq, raw, ids in raws:
            records = scan(raw).records
            if len(records) != 1 or records[0].seq != seq:
                raise OSError(f"spool {self.path}: record {seq} changed on disk")
            out.append(PendingRecord(seq, records[0].payload.decode(), ids))
        return out

    def _fd_read(self) -> int:
        if self._rfd is None:
            self._rfd = os.open(self.path, os.O_RDONLY)
        return self._rfd

    def ack(self, seqs: list[int]) -> None:
        """Record that SQS acknowledged ``seqs``; compact past the threshold."""
        if not seqs:
            return
        with self._io_lock:
            if self._closed:
                return  # a late sender after close(): the record is simply re-sent next time
            # No fsync: the page cache survives a killed process, and an ack lost with the
            # machine only means a resend that SQS deduplicates (and the writer's upsert absorbs).
            # Written outside _lock (append never touches the ack log; compaction, which
            # empties it, runs under _io_lock too): report() never waits for this write.
            try:
                write_all(self._ack_fd, b"".join(frame(seq, b"") for seq in seqs))
            except OSError as exc:
                # SQS has the messages: forget them in memory anyway (no endless re-send while
                # the disk is full). After a restart they are re-sent once and deduplicated.
                self._log.warning(
                    "ack log %s not written (%s); acknowledged reports may be re-sent after a "
                    "restart (deduplicated)",
                    self.ack_path,
                    exc,
                )
            with self._lock:
                if self._closed:
                    return
                for seq in seqs:
                    self._steps.pop(seq, None)
                    entry = self._pending.pop(seq, None)
                    if entry is not None:
                        self._pending_bytes -= entry[1]
                        self._garbage_bytes += entry[1]
                if self._should_compact():
                    self._compact_locked()

    def _should_compact(self) -> bool:
        # Only when the garbage is at least as large as the live part: each rewrite then at
        # least halves the file, so draining a backlog costs O(backlog) in total, not O(n^2).
        return self._garbage_bytes >= max(self._compact_threshold, self._pending_bytes)

    def reject(self, seq: int, body: str, reason: str) -> None:
        """Move one record SQS refused as the sender's fault to the rejected file, durably."""
        if self._closed:
            return
        fd = open_append(self.rejected_path)
        try:
            write_all(fd, frame(seq, f"{reason}\n{body}".encode()))
            os.fsync(fd)
        finally:
            os.close(fd)
        self.ack([seq])

    def _compact_locked(self) -> None:
        """Compact if the disk lets us; a failed compaction leaves the old spool untouched."""
        tmp = self.path.with_suffix(".spool.tmp")
        try:
            self._compact_into(tmp)
        except OSError as exc:
            # Compaction only reclaims space: the old spool and its ack log stay authoritative.
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._log.warning("spool %s: compaction skipped (%s)", self.path, exc)

    def _compact_into(self, tmp: Path) -> None:
        # Rewrite only the pending records to a temp file, fsync, rename over the spool, fsync
        # the directory; only then empty the ack log. A crash at any point leaves either the old
        # spool + its acks or the new spool (+ stale acks of records it no longer holds). Every
        # byte is written (write_all) before the rename, so a short write never replaces the
        # spool with a truncated copy.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        new_index: OrderedDict[int, tuple[int, int]] = OrderedDict()
        try:
            offset = 0
            chunks = []
            for seq, (old_offset, size) in self._pending.items():
                chunk = os.pread(self._fd_read(), size, old_offset)
                if len(chunk) != size:
                    raise OSError(errno.EIO, f"record {seq} short read")
                chunks.append(chunk)
                new_index[seq] = (offset, size)
                offset += size
            write_all(fd, b"".join(chunks))
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(self.path)
        fsync_dir(self.directory)
        for name in ("_fd", "_rfd"):
            old = getattr(self, name, None)
            if old is not None:
                os.close(old)
        self._rfd = None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._end = offset
        self._pending = new_index
        self._garbage_bytes = 0
        # The new spool holds no acknowledged record; an ack log that fails to empty only
        # names sequence numbers the spool no longer has.
        with contextlib.suppress(OSError):
            os.ftruncate(self._ack_fd, 0)
            os.fsync(self._ack_fd)

    def close(self) -> None:
        """Close the files and release the flock; pending records stay on disk."""
        # Both locks (ack's order): an ack-log write in progress must not hit a closed fd, or
        # worse a reused one.
        with self._io_lock, self._lock:
            self._closed = True
            for name in ("_fd", "_rfd", "_ack_fd", "_lock_fd"):
                fd = getattr(self, name, None)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                    setattr(self, name, None)
