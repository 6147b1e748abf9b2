"""The restart, in one collective call: every rank resumes from the same newest checkpoint whose
bytes are safe, with its files on this node.

``resumed = resume(reporter)`` is called by every rank at start-up, before the trainer is built
(the integrations' callbacks have a ``resume()`` method that calls it with their reporter):

1. **Hand over what this rank still holds.** The reporter was just built on the job's spool, so
   it recovered what the killed process left (spooled reports, checkpoints saved and not yet
   finished); ``flush`` sends them, bounded by half of ``deadline_s``. What is still unsent then
   stays on disk and is sent later; the decision is taken without it (a warning says so).
2. **Wait until the writer applied them.** The ranks gather (``all_gather_object``) the reports
   SQS accepted from each of them; rank 0 polls the database until their rows are there, or
   until the deadline (:mod:`trainer_client.integrations.restart_decide`).
3. **One rank decides.** Rank 0 reads the database, on one connection for the whole job, and
   verifies the candidate in its store as every resume helper does; the decision reaches every
   rank through ``broadcast_object_list``. Without an initialised ``torch.distributed`` there is
   nothing to agree through: each process waits for its own reports and asks on its own (a job
   of several processes should initialise the process group first).
4. **Restore to this node** when the checkpoint is in S3
   (:mod:`trainer_client.storage.restore`): verified while streaming, atomic, local copy first,
   once per node (a file lock; the node's other ranks wait for it and then find the copy). Every
   file of the checkpoint is restored on every node, sharded DCP directories included: DCP's
   loader reads the ``.metadata`` and whichever shards the load plan needs, which after a change
   of world size are not only the rank's own. The ranks then agree that every restore succeeded
   (``all_gather_object``), so none starts training alone.

The local path goes to the framework's own resume: ``trainer.train(resume_from_checkpoint=…)``,
``trainer.fit(model, ckpt_path=…)``, ``dcp.load(state, checkpoint_id=…)``.

Where the restored copy goes: ``restore_to/<name>`` when ``restore_to`` is given, else the
directory the checkpoint was uploaded from (its reports' ``extra.uploaded_from``; for the HF
``Trainer`` that is ``output_dir/checkpoint-N``, where the ``Trainer`` expects it).
"""

from __future__ import annotations

import logging
import os
import posixpath
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainer_client.integrations.exceptions import ResumeError
from trainer_client.integrations.restart_decide import Decision, InFlight, connect, decide
from trainer_client.integrations.resume import ResumePoint, _check_inputs
from trainer_client.reporter import CheckpointReporter
from trainer_client.storage.restore import DEFAULT_MAX_WORKERS, restore
from trainer_client.storage.uri import CheckpointUri
from trainer_client.storage.verify import s3_client_for

_log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 60.0
DATABASE_URL_ENV = "CKPT_RESUME_DATABASE_URL"


@dataclass(frozen=True)
class Resumed:
    """The checkpoint every rank resumes from, and where it is on this node."""

    point: ResumePoint
    # The local path to hand to the framework.
    path: str
    # "file" (the reports name a local path), "manifest"/"local" (an intact copy already on
    # this node), "store" (restored from S3 now)
    source: str
    fetched_bytes: int = 0
    # Seconds from the call to the decision every rank holds (the restore excluded).
    decided_s: float = 0.0

    @property
    def step(self) -> int:
        return self.point.step


def resume(
    reporter: CheckpointReporter,
    *,
    database_url: str | None = None,
    restore_to: str | os.PathLike[str] | None = None,
    deadline_s: float = DEFAULT_DEADLINE_S,
    check_files: bool = True,
    s3_client: Any = None,
    max_workers: int = DEFAULT_MAX_WORKERS,
    resume_diverged: bool = False,
) -> Resumed | None:
    """Every rank calls this at start-up; all get the same answer (see the module docstring).

    A checkpoint recorded as trained on a non-finite loss is skipped, with one line naming it
    (:mod:`trainer_client.integrations.diverged`), unless ``resume_diverged``.

    ``database_url`` defaults to ``CKPT_RESUME_DATABASE_URL`` (read by rank 0 only). Returns
    None when the job has no complete, intact checkpoint (start from scratch). Raises
    ``ResumeError`` on every rank when rank 0 cannot decide (bad input, database unreachable)
    or when a rank's restore failed.
    """
    started = time.monotonic()
    deadline = started + deadline_s
    config = reporter.config
    if not reporter.flush(timeout=max(0.0, deadline_s / 2)):
        _log.warning(
            "[job=%s rank=%s] reports still unsent after %.1f s (%s in the spool); the restart "
            "decides without them, they are sent later",
            config.job_id,
            config.rank,
            deadline_s / 2,
            reporter.pending,
        )
    mine = [(step, attempt, config.rank) for step, attempt in reporter.acknowledged]
    dist = _distributed()
    if dist is not None:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        in_flight: list[InFlight] = [tuple(r) for ranks in gathered for r in ranks]
    else:
        in_flight = mine
    if dist is None or dist.get_rank() == 0:
        if s3_client is None:
            s3_client = s3_client_for(max_workers, parse_timestamps=False)
        decision = _decide_safely(
            config.job_id,
            database_url or os.environ.get(DATABASE_URL_ENV),
            in_flight,
            deadline,
            check_files=check_files,
            s3_client=s3_client,
            max_workers=max_workers,
            resume_diverged=resume_diverged,
        )
    else:
        decision = None
    if dist is not None:
        box = [decision]
        dist.broadcast_object_list(box, src=0)
        decision = box[0]
    assert isinstance(decision, Decision)
    if decision.error is not None:
        raise ResumeError("resume", decision.error)
    if decision.point is None:
        _log.info("[job=%s] no complete checkpoint: starting from scratch", config.job_id)
        return None
    decided_s = time.monotonic() - started
    _log.info(
        "[job=%s rank=%s] resuming from step %s (decided in %.2f s)",
        config.job_id,
        config.rank,
        decision.point.step,
        decided_s,
    )
    resumed = _local(decision, restore_to, s3_client, max_workers, dist)
    return replace(resumed, decided_s=decided_s)


def _decide_safely(
    job_id: str,
    database_url: str | None,
    in_flight: list[InFlight],
    deadline: float,
    *,
    check_files: bool,
    s3_client: Any,
    max_workers: int,
    resume_diverged: bool,
) -> Decision:
    # Any failure is broadcast as the decision: the other ranks must not wait for an answer
    # that never comes.
    try:
        _check_inputs(job_id, database_url)
        assert database_url is not None
        with connect(database_url) as conn:
            return decide(
                conn,
                job_id,
                in_flight,
                deadline,
                check_files=check_files,
                s3_client=s3_client,
                max_workers=max_workers,
                resume_diverged=resume_diverged,
            )
    except Exception as exc:
        return Decision(None, error=f"rank 0 could not decide: {exc}")


def _local(
    decision: Decision,
    restore_to: str | os.PathLike[str] | None,
    client: Any,
    max_workers: int,
    dist: Any,
) -> Resumed:
    point = decision.point
    assert point is not None
    error: str | None = None
    resumed: Resumed | None = None
    if not decision.objects:
        resumed = Resumed(point, point.path, "file")
    else:
        try:
            dest = _destination(point.path, decision.uploaded_from, restore_to)
            done = restore(decision.objects, dest, client=client, max_workers=max_workers)
            resumed = Resumed(point, str(done.path), done.source, done.fetched_bytes)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    errors = [error]
    if dist is not None:
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
    failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
    if failed:
        rank, first = failed[0]
        raise ResumeError("restore", f"step {point.step}: rank {rank}: {first}")
    assert resumed is not None
    return resumed


def _destination(
    location: str, uploaded_from: str | None, restore_to: str | os.PathLike[str] | None
) -> Path:
    name = posixpath.basename(CheckpointUri.parse(location).path.rstrip("/"))
    if restore_to is not None:
        return Path(restore_to) / name
    if uploaded_from:
        return Path(uploaded_from)
    raise ResumeError(
        "restore_to", f"{location} names no local directory it came from: pass restore_to="
    )


def _distributed() -> Any:
    """torch.distributed when a process group is initialised with more than one rank."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None
