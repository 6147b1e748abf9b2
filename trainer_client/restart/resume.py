"""The restart, in one collective call: every rank resumes from the same newest checkpoint whose
bytes are safe, with its files on this node.

``resumed = resume(reporter)`` is called by every rank at start-up, before the trainer is built
(the integrations' callbacks have a ``resume()`` method that calls it with their reporter):

1. **Hand over what this rank still holds.** The reporter was just built on the job's spool, so
   it recovered what the killed process left (spooled reports, checkpoints saved and not yet
   finished); ``flush`` sends them, bounded by half of ``deadline_s``. What is still unsent then
   stays on disk and is sent later; the decision is taken without it (a warning says so).
2. **Wait until the writer applied them.** Rank 0 learns the (step, attempt) of the reports SQS
   accepted from every rank by fixed-size all-reduces, then polls the database in rounds: it
   broadcasts which ranks' rows are missing, each rank checks its own, an all-reduce counts
   what is still missing, until nothing is or the deadline
   (:mod:`trainer_client.restart.wire`).
3. **One rank decides.** Rank 0 reads the database, on one connection for the whole job, and
   verifies the candidate in its store as every resume helper does; the decision's header
   reaches every rank in one broadcast of a uint8 tensor (:mod:`.wire_decision`), its object
   table only each node's first rank, with only the rows its node may fetch
   (:mod:`.wire_table`): the bytes a rank receives do not grow with the ranks. Without an
   initialised ``torch.distributed`` there is nothing to agree through: each process waits for
   its own reports and asks on its own (a job of several processes should initialise the
   process group first).
4. **Restore to this node** when the checkpoint is in S3
   (:mod:`trainer_client.storage.restore`): verified while streaming, atomic, local copy first,
   once per node (a file lock; the node's other ranks wait for it and then find the copy). At
   another world size than the checkpoint's, :mod:`.world` first refuses on every rank
   what the framework cannot load (DeepSpeed ZeRO partitions) or says in one line what follows
   the ranks. The ranks then agree that every restore succeeded (a SUM and a MIN of one
   integer), so none starts training alone. A node restores what its ranks load and nothing
   else (:mod:`.node_fetch`): the common files, its ranks' own files and, of other ranks' DCP
   files, the byte ranges of the items its ranks read (``.metadata`` read first); everything
   after a change of world size. What every node reads (``.metadata``, the replicated items)
   rank 0 reads once and the leaders hand down a tree (:mod:`.relay`).

5. **A new launch.** The decision carries the launch every rank reports as from now on, numbered
   above every attempt the job had (:mod:`trainer_client.report.launch`); rank 0 says what it
   decided, and why, on stderr whatever the logging setup (:mod:`.say`). It refuses to start
   from scratch while reports of an earlier launch are unsent or unwritten (``start_over=True`` to).

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
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainer_client._log import say
from trainer_client.config import resume_database_url
from trainer_client.exceptions import ResumeError
from trainer_client.report.reporter import CheckpointReporter
from trainer_client.restart import relay
from trainer_client.restart.decide import (
    DEFAULT_LOOP_AFTER,
    Decision,
    InFlight,
    connect_for_restart,
    decide_restart,
)
from trainer_client.restart.lookup import ResumePoint
from trainer_client.restart.node_fetch import NodeFetch, fetch_for_node, read_metadata, this_node
from trainer_client.restart.node_share import NodeRanks, StoredItem
from trainer_client.restart.read_db import check_inputs
from trainer_client.restart.record import fetch_totals, restart_record
from trainer_client.restart.say import (
    RestoreProgress,
    name_other_jobs,
    size,
    tell_decision,
)
from trainer_client.restart.wire import (
    Summary,
    all_succeeded,
    poll_rows,
    summarize,
    wait_written,
)
from trainer_client.restart.wire_table import share_header, share_table
from trainer_client.restart.world import check_world_size
from trainer_client.storage.restore import RESTORE_MAX_WORKERS, restore
from trainer_client.storage.restore_fetch import FetchTrace
from trainer_client.storage.uri import CheckpointUri
from trainer_client.storage.verify import s3_client_for

_log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 60.0


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
    max_workers: int = RESTORE_MAX_WORKERS,
    start_over: bool = False,
    loop_after: int = DEFAULT_LOOP_AFTER,
    step_back_on_loop: bool = False,
    resume_diverged: bool = False,
) -> Resumed | None:
    """Every rank calls this at start-up; all get the same answer (see the module docstring),
    and every rank reports as the launch the answer numbers (trainer_client/report/launch.py).

    A checkpoint recorded as trained on a non-finite loss is skipped, with one line naming it
    (:mod:`trainer_client.restart.diverged`), unless ``resume_diverged``.

    ``database_url`` defaults to ``CKPT_RESUME_DATABASE_URL`` (read by rank 0 only). Returns
    None when the job has no complete, intact checkpoint (start from scratch). Raises
    ``ResumeError`` on every rank when rank 0 cannot decide (bad input, database unreachable),
    when a rank's restore failed, or when the answer would be "from scratch" while reports of
    an earlier launch are unsent or unwritten (the queue refused them): ``start_over=True``
    starts from scratch anyway. The ``loop_after``-th restart in a row from one checkpoint
    warns (a crash loop); ``step_back_on_loop=True`` resumes from the one before it instead.
    Rank 0 then sends the restart's record (``ckpt.restart.v1``) through the reporter.
    """
    if not (isinstance(loop_after, int) and not isinstance(loop_after, bool) and loop_after >= 2):
        raise ResumeError("loop_after", f"must be an integer >= 2, got {loop_after!r}")
    started = time.monotonic()
    deadline = started + deadline_s
    config = reporter.config
    unsent = 0
    if not reporter.flush(timeout=max(0.0, deadline_s / 2)):
        unsent = reporter.pending
    send_error = reporter.last_error if unsent else None
    current = reporter.launch
    in_flight = [(step, attempt, config.rank) for step, attempt in reporter.acknowledged]
    dist = _distributed()
    rank = 0 if dist is None else int(dist.get_rank())
    summary = summarize(
        dist,
        rank=rank,
        in_flight=reporter.acknowledged,
        recorded_attempt=reporter.recorded_attempt,
        unsent=unsent,
        send_error=None if send_error is None else f"{type(send_error).__name__}: {send_error}",
        began=None if current is None else (current.run_attempt, current.how),
    )
    with ExitStack() as held:
        conn: Any = None
        opened: str | None = None
        if rank == 0 and summary.began is None:
            try:
                check_inputs(config.job_id, resume_database_url(database_url))
                conn = held.enter_context(
                    connect_for_restart(resume_database_url(database_url) or "")
                )
            except Exception as exc:
                opened = f"rank 0 could not decide: {exc}"
        unwritten: tuple[int, InFlight | None] = (0, None)
        if dist is not None and summary.slots and summary.began is None:
            unwritten = wait_written(
                dist,
                rank=rank,
                slots=summary.slots,
                mine=reporter.acknowledged,
                poll=None if conn is None else poll_rows(conn, config.job_id, summary.slots, dist),
                deadline=deadline,
            )
        decision: Decision | None = None
        if rank == 0:
            if s3_client is None:
                # Pool for the restore's GETs and the relay's small ones (relay.py).
                s3_client = s3_client_for(
                    max(max_workers, relay.RELAY_GET_WORKERS), parse_timestamps=False
                )
            decision = _decide_safely(
                conn,
                opened,
                config.job_id,
                summary,
                in_flight if dist is None else [],
                unwritten,
                deadline,
                launcher_attempt=config.run_attempt,
                agreed=dist is not None or config.world_size == 1,
                start_over=start_over,
                loop_after=loop_after,
                step_back_on_loop=step_back_on_loop,
                check_files=check_files,
                s3_client=s3_client,
                max_workers=max_workers,
                resume_diverged=resume_diverged,
            )
    node = this_node(dist)
    # Rank 0's reading of .metadata for the nodes' tables, kept for its own node's restore.
    read: list[NodeFetch] = []

    def read_items(chosen: Decision) -> Mapping[str, Sequence[StoredItem]]:
        assert chosen.point is not None
        try:
            dest = _destination(chosen.point.path, chosen.uploaded_from, restore_to)
            read.append(
                read_metadata(chosen.objects, dest, client=s3_client, max_workers=max_workers)
            )
        except Exception:  # every node's table then holds every DCP file; the restore says why
            return {}
        return read[0].dcp

    held_here = None
    if dist is not None:
        held_here = share_header(dist, decision, rank=rank, node=node)
        decision = held_here.decision
    assert isinstance(decision, Decision)
    if decision.error is not None:
        raise ResumeError("resume", decision.error)
    assert decision.launch is not None
    reporter.begin_launch(decision.launch)
    decided_s = time.monotonic() - started
    speaks = rank == 0
    if speaks:
        tell_decision(config.job_id, decision, [summary], decided_s, loop_after=loop_after)
        if decision.point is None:
            name_other_jobs(config.spool_dir, config.job_id)
    resumed = None
    if decision.point is not None:
        check_world_size(config.job_id, decision, config.world_size, speaks=speaks)
        objects, restores = len(decision.objects), True
        mine = read[0] if read else None
        relayed = relay.Relay()
        if held_here is not None:  # this node's rows, on its first rank only
            decision = share_table(dist, held_here, rank=rank, read_items=read_items)
            objects, restores = held_here.objects, held_here.restores
            mine, relayed = relay.receive(
                dist, held_here, rank, decision, mine, client=s3_client, max_workers=max_workers
            )
        resumed = _local(
            decision,
            restore_to,
            s3_client,
            max_workers,
            dist,
            rank,
            _Node(node, objects, restores, mine, relayed.ranges),
        )
    restored_s = time.monotonic() - started
    totals = fetch_totals(dist, 0 if resumed is None else resumed.fetched_bytes)
    if speaks:
        if resumed is not None and resumed.fetched_bytes:
            say(
                _log,
                logging.INFO,
                "job %s: step %s restored to %s (%s fetched from the store)",
                config.job_id,
                resumed.step,
                resumed.path,
                size(resumed.fetched_bytes),
            )
        record = restart_record(
            reporter.config,
            decision,
            summary,
            totals,
            summary.slots[0][0] if summary.slots else None,
            decided_s,
            restored_s,
            None if resumed is None else resumed.source,
            loop_after,
        )
        reporter.send_restart_record(record)
    return None if resumed is None else replace(resumed, decided_s=decided_s)


def _decide_safely(
    conn: Any,
    opened: str | None,
    job_id: str,
    summary: Summary,
    in_flight: list[InFlight],
    waited: tuple[int, InFlight | None],
    deadline: float,
    *,
    launcher_attempt: int,
    agreed: bool,
    start_over: bool,
    loop_after: int,
    step_back_on_loop: bool,
    check_files: bool,
    s3_client: Any,
    max_workers: int,
    resume_diverged: bool,
) -> Decision:
    # Any failure is broadcast as the decision: the other ranks must not wait for an answer
    # that never comes.
    if summary.began is not None:
        rank, what = summary.began
        return Decision(
            None,
            error=f"rank {rank} already reports as {what}: call resume() before the first report",
        )
    if opened is not None:
        return Decision(None, error=opened)
    try:
        decision = decide_restart(
            conn,
            job_id,
            in_flight,
            deadline,
            check_files=check_files,
            s3_client=s3_client,
            max_workers=max_workers,
            launcher_attempt=launcher_attempt,
            recorded_attempt=summary.recorded_attempt,
            agreed=agreed,
            loop_after=loop_after,
            step_back_on_loop=step_back_on_loop,
            resume_diverged=resume_diverged,
        )
    except Exception as exc:
        return Decision(None, error=f"rank 0 could not decide: {exc}")
    count, first = waited
    if first is not None:  # the distributed wait's count of what is still unwritten
        decision = replace(decision, unwritten=(first,), unwritten_count=count)
    if decision.point is None and (summary.unsent or decision.unwritten) and not start_over:
        return replace(decision, error=_refusal(summary, decision))
    return decision


def _refusal(summary: Summary, decision: Decision) -> str:
    """Why the restart will not start from scratch: reports of an earlier launch are held."""
    parts = []
    if summary.unsent:
        parts.append(
            f"could not send {summary.unsent} spooled message(s) of an earlier launch (rank "
            f"{summary.unsent_rank}: {summary.send_error or 'not accepted before the deadline'}); "
            "check CKPT_QUEUE_URL and the queue's permissions"
        )
    if decision.unwritten:
        step, attempt, rank = decision.unwritten[0]
        parts.append(
            f"{decision.unwritten_reports} report(s) SQS accepted are not in the database "
            f"(first: step {step} rank {rank} attempt {attempt}); check the writer and the DLQ "
            "(ckpt-pipeline status)"
        )
    return (
        "refusing to start from scratch: "
        + "; ".join(parts)
        + ". Restart once they are written, or pass start_over=True to start from scratch"
    )


@dataclass(frozen=True)
class _Node:
    """This rank's part in its node's restore."""

    ranks: NodeRanks
    # The checkpoint's objects (this rank may hold none of their rows).
    objects: int
    # This rank restores for the node; else the node's first rank does and this one waits.
    restores: bool
    read: NodeFetch | None
    # Byte ranges every node reads, handed on by rank 0 (:mod:`.relay`).
    relayed: Mapping[str, Sequence[tuple[int, bytes]]]


def _local(
    decision: Decision,
    restore_to: str | os.PathLike[str] | None,
    client: Any,
    max_workers: int,
    dist: Any,
    rank: int,
    node: _Node,
) -> Resumed:
    point = decision.point
    assert point is not None
    error: str | None = None
    resumed: Resumed | None = None
    if not node.objects:
        resumed = Resumed(point, point.path, "file")
    elif not node.restores:
        try:
            # The node's first rank restores; all_succeeded below returns once it has, and the
            # copy then holds its manifest.
            dest = _destination(point.path, decision.uploaded_from, restore_to)
            resumed = Resumed(point, str(dest), "manifest")
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    else:
        try:
            dest = _destination(point.path, decision.uploaded_from, restore_to)
            # What this node's ranks load, and nothing else (.metadata read first).
            mine = fetch_for_node(
                decision.objects,
                dest,
                node=node.ranks,
                saved_world_size=point.world_size,
                client=client,
                max_workers=max_workers,
                read=node.read,
            )
            trace = FetchTrace()
            with RestoreProgress(trace, mine.share.bytes):
                done = restore(
                    mine.share.objects,
                    dest,
                    client=client,
                    max_workers=max_workers,
                    trace=trace,
                    ranges=mine.share.ranges,
                    preloaded=mine.preloaded,
                    relayed=node.relayed,
                )
            fetched = done.fetched_bytes + mine.fetched_bytes
            resumed = Resumed(point, str(done.path), done.source, fetched)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    # One SUM and one MIN of an integer instead of gathering every rank's error: the failing
    # rank says its own, the others name it.
    failed = all_succeeded(dist, rank=rank, failed=error is not None)
    if error is not None:
        raise ResumeError("restore", f"step {point.step}: rank {rank}: {error}")
    if failed is not None:
        count, first = failed
        raise ResumeError(
            "restore", f"step {point.step}: {count} rank(s) failed to restore, see rank {first}"
        )
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
