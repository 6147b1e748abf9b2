"""A finish job: what must happen to a saved checkpoint before it is reported, kept on disk.

The training thread writes one job record (a small JSON file: temp file and rename, no fsync)
before its save returns; the finisher makes the record durable together with the files, hashes
them, runs the post-steps and reports, then removes the record. A record still on disk at the
next start of a reporter on the same spool is finished then (or dropped, with a warning, when its
files changed).

Records live in ``<spool_dir>/<job_id>/rank-<r>.finishing/<seq>.json``; a post-step may keep its
own progress in ``<seq>.d/`` beside it (removed with the record).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_client.exceptions import JobRecordInvalid
from trainer_client.storage.durable import (
    FileIdentity,
    fsync_dir,
    fsync_path,
    mkdir_durable,
    write_all,
)

RECORD_FORMAT = 1
_RECORD_NAME = re.compile(r"^(\d{12})\.json$")


@dataclass(frozen=True)
class FileToFinish:
    """One file of a checkpoint: its name in the report, its path, and what it was when saved.

    ``staged`` is a temporary path the finisher renames to ``path`` once the data is durable
    (the async ``atomic_torch_save``): the file appears under its final name only when whole.
    """

    name: str
    path: str
    identity: FileIdentity
    staged: str | None = None

    def current_path(self) -> str:
        """Where the file is now: its staged path until the finisher renamed it."""
        if self.staged is not None and os.path.lexists(self.staged):
            return self.staged
        return self.path


@dataclass(frozen=True)
class PostStepCall:
    """A post-step to run on the job, by its registered name, with JSON parameters."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FinishJob:
    """Everything the finisher needs, JSON-serialisable (see the module docstring).

    ``fields`` are the validated report fields (step, epoch, uri, loss, metrics, extra) without
    ``bytes``/``sha256``, which the finisher fills from the files. ``run_attempt`` and
    ``world_size`` are those of the save, and ``launch_id`` its launch (None in a record of a
    client before launches), kept so that a later launch finishing the job reports it as the
    launch that saved it.
    """

    seq: int
    base: str
    files: tuple[FileToFinish, ...]
    fields: Mapping[str, Any]
    run_attempt: int
    world_size: int
    checksums: bool = False
    list_files: bool = False
    post: tuple[PostStepCall, ...] = ()
    launch_id: str | None = None

    @property
    def step(self) -> int:
        """The checkpoint's training step."""
        return int(self.fields["step"])

    def to_json(self) -> bytes:
        """The record's bytes on disk."""
        return json.dumps(
            {
                "format": RECORD_FORMAT,
                "seq": self.seq,
                "base": self.base,
                "files": [
                    {
                        "name": f.name,
                        "path": f.path,
                        "staged": f.staged,
                        "inode": f.identity.inode,
                        "size": f.identity.size,
                        "mtime_ns": f.identity.mtime_ns,
                    }
                    for f in self.files
                ],
                "fields": dict(self.fields),
                "run_attempt": self.run_attempt,
                "world_size": self.world_size,
                "checksums": self.checksums,
                "list_files": self.list_files,
                "post": [{"name": p.name, "params": dict(p.params)} for p in self.post],
                "launch_id": self.launch_id,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> FinishJob:
        """Parse a record; raises :class:`JobRecordInvalid` naming what is wrong."""
        try:
            raw = json.loads(data)
            if raw.get("format") != RECORD_FORMAT:
                raise JobRecordInvalid(f"format {raw.get('format')!r}, this client reads 1")
            return cls(
                seq=int(raw["seq"]),
                base=str(raw["base"]),
                files=tuple(
                    FileToFinish(
                        name=str(f["name"]),
                        path=str(f["path"]),
                        staged=None if f["staged"] is None else str(f["staged"]),
                        identity=FileIdentity(int(f["inode"]), int(f["size"]), int(f["mtime_ns"])),
                    )
                    for f in raw["files"]
                ),
                fields=dict(raw["fields"]),
                run_attempt=int(raw["run_attempt"]),
                world_size=int(raw["world_size"]),
                checksums=bool(raw["checksums"]),
                list_files=bool(raw["list_files"]),
                post=tuple(PostStepCall(str(p["name"]), dict(p["params"])) for p in raw["post"]),
                launch_id=_launch_id(raw.get("launch_id")),
            )
        except JobRecordInvalid:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise JobRecordInvalid(f"unreadable job record: {exc!r}") from None


class JobStore:
    """The directory of job records of one (job, rank); one owner (the spool's flock holder)."""

    def __init__(self, directory: Path, log: logging.LoggerAdapter[logging.Logger]) -> None:
        self.directory = directory
        self._log = log
        mkdir_durable(directory)
        seqs = [seq for seq, _ in self._records()]
        self._next_seq = max(seqs, default=-1) + 1
        self._last_saved = self._next_seq - 1

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest job saved (or recovered); -1 if none."""
        return self._last_saved

    def _records(self) -> Iterator[tuple[int, Path]]:
        for entry in sorted(self.directory.iterdir()):
            match = _RECORD_NAME.match(entry.name)
            if match:
                yield int(match.group(1)), entry

    def next_seq(self) -> int:
        """A new job's sequence number (the caller serialises submissions)."""
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def record_path(self, seq: int) -> Path:
        """The record file of job ``seq``."""
        return self.directory / f"{seq:012d}.json"

    def state_dir(self, seq: int) -> Path:
        """A post-step's own directory for job ``seq`` (created on demand, removed with it)."""
        return self.directory / f"{seq:012d}.d"

    def note_path(self, seq: int) -> Path:
        """Why job ``seq`` was last left unfinished (a line of text; removed with the job)."""
        return self.directory / f"{seq:012d}.why"

    def note_deferred(self, seq: int, reason: str) -> None:
        """Keep why job ``seq`` was deferred beside its record (no fsync: a hint for whoever
        looks next, ``ckpt-pipeline spool send`` among them, not a state)."""
        # The job itself is on disk; a note that cannot be written only loses the hint.
        with contextlib.suppress(OSError):
            self.note_path(seq).write_text(reason + "\n")

    def save(self, job: FinishJob) -> None:
        """Write the record whole (temp file, rename) without fsync: when this returns, a killed
        process does not lose the job (the page cache keeps it); :meth:`persist` makes it
        survive a machine crash.

        No fsync here, on the training thread: an fsync issued while the framework's gigabytes are
        being written back waits behind them (ext4 commits them in the same journal transaction),
        which cost up to a second per save. A record lost with the machine is one whose checkpoint
        was not durable either (the finisher had not fsync'd it yet): nothing is reported for it.
        """
        path = self.record_path(job.seq)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, job.to_json())
        finally:
            os.close(fd)
        tmp.replace(path)
        self._last_saved = max(self._last_saved, job.seq)

    def persist(self, seq: int) -> None:
        """Make job ``seq``'s record durable (file and directory), on the finisher's thread once
        the checkpoint's files are: from then on a machine crash finishes it at the next start."""
        fsync_path(self.record_path(seq))
        fsync_dir(self.directory)

    def remove(self, seq: int) -> None:
        """Remove a finished or dropped job's record (and its post-step directory), durably.

        A crash before the removal is durable finishes the job again at the next start: the
        report is then sent twice with the same deduplication id, which SQS and the writer's
        upsert absorb.
        """
        state = self.state_dir(seq)
        if state.exists():
            shutil.rmtree(state, ignore_errors=True)
        self.note_path(seq).unlink(missing_ok=True)
        try:
            self.record_path(seq).unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.directory)

    def load_all(self) -> list[FinishJob]:
        """Every readable record, oldest first; an unreadable one is moved aside, with a warning."""
        jobs = []
        for seq, path in self._records():
            try:
                jobs.append(FinishJob.from_json(path.read_bytes()))
            except (JobRecordInvalid, OSError) as exc:
                aside = path.with_suffix(".invalid")
                self._log.warning("finish job %s unreadable (%s); moved to %s", seq, exc, aside)
                path.replace(aside)
        return jobs


def _launch_id(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise JobRecordInvalid(f"launch_id must be a string, got {type(value).__name__}")


@dataclass(frozen=True)
class JobLeft:
    """A finish job still on disk: its checkpoint's step, the post-steps it asks for, and why
    it was last deferred (None when no finisher has tried it, or said nothing)."""

    step: int
    post: tuple[PostStepCall, ...]
    why: str | None


def jobs_left(directory: Path) -> list[JobLeft]:
    """The finish jobs on disk in one ``rank-<r>.finishing`` directory, oldest first, read
    without taking the directory over (an unreadable record is skipped: its owner moves it)."""
    if not directory.is_dir():
        return []
    left = []
    for entry in sorted(directory.iterdir()):
        if not _RECORD_NAME.match(entry.name):
            continue
        try:
            job = FinishJob.from_json(entry.read_bytes())
        except (JobRecordInvalid, OSError):
            continue
        try:
            why: str | None = entry.with_suffix(".why").read_text().strip() or None
        except OSError:
            why = None
        left.append(JobLeft(job.step, job.post, why))
    return left
