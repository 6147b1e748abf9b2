"""Launches: every start of a job's processes reports under a run_attempt of its own.

A Spot relaunch is a new ``torchrun`` on a new node, whose ``TORCHELASTIC_RESTART_COUNT`` is 0
again; reporting under the launcher's count would file the new launch's shards under the dead
launch's attempt (one "complete" checkpoint from two trainings). So the pipeline numbers
launches itself (docs/DESIGN.md, "Launches"):

* **The restart call numbers it** (``resume(reporter)``): rank 0 reads the job's attempts from the
  database (``training_job_launches``, ``training_checkpoints``) after the spools' reports were
  written, takes every rank's recorded launch, and hands every rank
  ``max(launcher's count, 1 + every attempt seen)`` with a new launch id, in the decision's
  broadcast.
* **Without a restart call** (a plain loop that never calls it) the reporter begins the launch at
  its first report: ``max(launcher's count, 1 + the attempt this spool recorded)``, agreed by
  every rank through torch.distributed's store (the first proposal wins, no collective, no wait),
  else the process's own proposal.
* **Whatever a client does**, the writer refuses a report whose attempt another launch claimed
  (migration 0014), so two launches are never counted as one checkpoint; they only lose that
  checkpoint's count, loudly (the DLQ), where the numbering above could not see the earlier one.

Each rank records its launch durably beside its spool (``rank-N.launch``), so that the next
launch numbers above it even when the database never heard of it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_contract.message import INT32_MAX, LAUNCH_ID_PATTERN

_log = logging.getLogger(__name__)

# The store key every rank of one launch proposes under: torchrun's store is new at every launch
# and at every restart of one (torch/distributed/rendezvous.py, _create_c10d_store), and the
# launcher's count in the key keeps two restarts apart should a store outlive one.
_STORE_KEY = "ckpt-pipeline/launch/{job_id}/{launcher_attempt}"


@dataclass(frozen=True)
class Launch:
    """The run_attempt and launch id every report of this launch carries; ``how`` says who
    numbered it ("restart", "store", "process")."""

    run_attempt: int
    # None where the ranks could not agree on one (no process group): reports then carry none,
    # and the writer checks them against nothing, as before launches.
    launch_id: str | None
    how: str = "process"

    def to_json(self) -> str:
        return json.dumps({"run_attempt": self.run_attempt, "launch_id": self.launch_id})

    @classmethod
    def from_json(cls, text: str | bytes, how: str) -> Launch:
        value = json.loads(text)
        attempt, launch_id = value["run_attempt"], value["launch_id"]
        if not (isinstance(attempt, int) and 0 <= attempt <= INT32_MAX):
            raise ValueError(f"run_attempt {attempt!r} out of range")
        if launch_id is not None and not (
            isinstance(launch_id, str) and re.match(LAUNCH_ID_PATTERN, launch_id)
        ):
            raise ValueError(f"launch_id {launch_id!r} is not a launch id")
        return cls(attempt, launch_id, how)


def new_launch_id() -> str:
    """A fresh launch id (random: nothing about a launch is unique and known to every rank)."""
    return uuid.uuid4().hex


def next_attempt(launcher_attempt: int, *seen: int | None) -> int:
    """The attempt of a new launch: the launcher's count, or one above every attempt seen."""
    known = [a for a in seen if a is not None]
    attempt = max([launcher_attempt, *(a + 1 for a in known)])
    if attempt > INT32_MAX:
        raise ValueError(f"run_attempt would exceed {INT32_MAX}")
    return attempt


def record_path(directory: Path, rank: int) -> Path:
    """Where a rank records its launch, beside its spool."""
    return directory / f"rank-{rank}.launch"


def recorded_attempt(directory: Path, rank: int) -> int | None:
    """The newest attempt recorded by this rank or by rank 0 (one view when the spool directory
    is shared, as it should be: EFS), or None."""
    found: list[int] = []
    for path in {record_path(directory, rank), record_path(directory, 0)}:
        try:
            found.append(Launch.from_json(path.read_text(), "record").run_attempt)
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.warning("ignoring the unreadable launch record %s: %s", path, exc)
    return max(found, default=None)


def record(directory: Path, rank: int, launch: Launch) -> None:
    """Record ``launch`` durably (written aside, fsynced, renamed, the directory fsynced): before
    the launch's first report is spooled, on the thread that spools it (never a save's training
    thread: finish() spools from the finisher), so that the next launch numbers above it."""
    path = record_path(directory, rank)
    # Unique per writer: two processes of one rank (a stale one and its restart) never share it.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(launch.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def agree(job_id: str, launcher_attempt: int, proposal: Launch) -> Launch:
    """The launch every rank of this process group uses: the first proposal put in
    torch.distributed's store; ``proposal`` itself without a process group of several ranks."""
    store = _default_store()
    if store is None:
        return proposal
    key = _STORE_KEY.format(job_id=job_id, launcher_attempt=launcher_attempt)
    try:
        agreed = store.compare_set(key, "", proposal.to_json())
        return Launch.from_json(agreed, "store")
    except Exception as exc:  # a store that cannot answer must not stop the training
        _log.warning("cannot agree on the launch through the store (%s); proposing alone", exc)
        return proposal


def begin_here(
    job_id: str,
    launcher_attempt: int,
    *,
    world_size: int,
    attempt_given: bool,
    recorded: int | None,
) -> Launch | None:
    """The launch a process begins at its first report when no restart call numbered it, or None
    when its ranks cannot agree on one (several ranks and no process group).

    An attempt the caller gave (``run_attempt=``) is kept: the caller numbers its launches.
    Otherwise one above the attempt this spool recorded, at least the launcher's count.
    """
    store = _default_store()
    if store is None and world_size > 1:
        return None
    attempt = launcher_attempt if attempt_given else next_attempt(launcher_attempt, recorded)
    proposal = Launch(attempt, new_launch_id(), "process")
    return proposal if store is None else agree(job_id, launcher_attempt, proposal)


def _default_store() -> Any:
    # Only if the caller imported torch (the client works without it), and only with a process
    # group of several ranks: a single process proposes alone.
    if sys.modules.get("torch") is None:
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    from torch.distributed import distributed_c10d

    try:
        return distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None
