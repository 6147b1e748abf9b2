"""Batch planning (pure): one row per checkpoint and per shard, merged and sorted by key.

Merging inside the batch applies the same rule as the database's ``ON CONFLICT`` clauses
(docs/DESIGN.md, "The writer: counting shards in slot rows"), so a batch written at once ends in
the same rows as its records written one by one in any order. Sorting by key makes every writer
lock rows in one global order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from ckpt_contract import CheckpointReport
from lambda_writer.writer.records import ValidReport, principal_of

CheckpointKey = tuple[str, int]
# (job_id, owner principal, the whole SenderId): who claims each job the batch writes.
JobSender = tuple[str, str, str]
# (job_id, step, rank, run_attempt, launch_id): a launch claim of the batch, one per (job, step,
# run_attempt, launch) with its first rank in key order (migration 0018 names it in a refusal).
LaunchClaim = tuple[str, int, int, int, str]
ShardKey = tuple[str, int, int]


class CheckpointUpsert(NamedTuple):
    """The batch's contribution to one ``training_checkpoints`` row.

    Rows are NamedTuples: immutable, and cheaper to build than frozen dataclasses (one per record
    on the hot path; measured with bench/writer_throughput.py).
    """

    job_id: str
    step: int
    run_attempt: int
    epoch: int
    world_size: int
    first_reported_at: datetime

    @property
    def key(self) -> CheckpointKey:
        return (self.job_id, self.step)

    def merge(self, other: CheckpointUpsert) -> CheckpointUpsert:
        """The join of two contributions: newest attempt wins; within it, max world_size/epoch."""
        first = min(self.first_reported_at, other.first_reported_at)
        if other.run_attempt > self.run_attempt:
            newest = other
        elif other.run_attempt < self.run_attempt:
            newest = self
        else:
            newest = CheckpointUpsert(
                self.job_id,
                self.step,
                self.run_attempt,
                max(self.epoch, other.epoch),
                max(self.world_size, other.world_size),
                first,
            )
        return CheckpointUpsert(
            newest.job_id,
            newest.step,
            newest.run_attempt,
            newest.epoch,
            newest.world_size,
            first,
        )


class ShardRow(NamedTuple):
    """One ``training_checkpoint_shards`` row as the batch wants it."""

    job_id: str
    step: int
    rank: int
    run_attempt: int
    epoch: int
    world_size: int
    uri: str
    loss: float | None
    metrics_json: str
    size_bytes: int | None
    sha256: str | None
    extra_json: str
    sqs_message_id: str
    reported_at: datetime
    # The report's pinned objects as a JSON text (ckpt_contract/objects.py), "null" without.
    objects_json: str = "null"

    @property
    def key(self) -> ShardKey:
        return (self.job_id, self.step, self.rank)


@dataclass(frozen=True)
class BatchPlan:
    """What one transaction writes: rows sorted by key, and how many records they came from."""

    checkpoints: tuple[CheckpointUpsert, ...]
    shards: tuple[ShardRow, ...]
    records: int
    # Two launches report one (job, run_attempt) in this batch: merging them here would drop one
    # unseen, so the batch is written one record per transaction and the database's launch
    # guard (migration 0014) refuses the later one with its reason.
    launch_conflict: bool = False
    # Each (job, principal) of the batch once, in delivery order: the database claims a new job
    # for the first and refuses the batch if a job belongs to another principal (migration 0015).
    senders: tuple[JobSender, ...] = ()
    # The shard rows' launches, checked and claimed once for the batch (migration 0018).
    launches: tuple[LaunchClaim, ...] = ()

    @property
    def duplicates(self) -> int:
        """Records merged away inside the batch (same shard twice): replays by definition."""
        return self.records - len(self.shards)


def shard_row(valid: ValidReport) -> ShardRow:
    """The shard row one report asks for."""
    r = valid.report
    return ShardRow(
        job_id=r.job_id,
        step=r.step,
        rank=r.rank,
        run_attempt=r.run_attempt,
        epoch=r.epoch,
        world_size=r.world_size,
        uri=r.uri,
        loss=None if r.loss is None else float(r.loss),
        metrics_json=json.dumps(r.metrics, sort_keys=True),
        size_bytes=r.bytes,
        sha256=r.sha256,
        extra_json=json.dumps(_extra(r), sort_keys=True, default=str),
        sqs_message_id=valid.message.message_id,
        reported_at=r.created_at,
        objects_json=_objects_json(r),
    )


def _extra(report: CheckpointReport) -> dict[str, object]:
    # The launch goes where the previous release's writer kept it (an unknown field, in extra):
    # one place for migration 0014's launch guard to read, whichever writer stored the row.
    if report.launch_id is None:
        return report.extra
    return {**report.extra, "launch_id": report.launch_id}


def _objects_json(report: CheckpointReport) -> str:
    if report.objects is None:
        return "null"
    # The pins as the client sent them, absent ones left out (StoredObject's serializer).
    return json.dumps([o.model_dump() for o in report.objects], separators=(",", ":"))


def checkpoint_row(valid: ValidReport) -> CheckpointUpsert:
    """The checkpoint contribution of one report."""
    r = valid.report
    return CheckpointUpsert(r.job_id, r.step, r.run_attempt, r.epoch, r.world_size, r.created_at)


def plan_batch(reports: Iterable[ValidReport]) -> BatchPlan:
    """Merge ``reports`` (in delivery order) into one row per key, sorted by key.

    A shard keeps the highest run_attempt; for equal attempts the first delivered wins, as a later
    replay of the same attempt is a no-op in the database too.
    """
    checkpoints: dict[CheckpointKey, CheckpointUpsert] = {}
    shards: dict[ShardKey, ShardRow] = {}
    launches: dict[tuple[str, int], str] = {}
    # The launch of each kept shard row (its extra's launch_id, what 0014's trigger reads).
    shard_launches: dict[ShardKey, str] = {}
    conflict = False
    # (job, SenderId) in delivery order; reduced to principals once per distinct pair below.
    senders: dict[tuple[str, str], None] = {}
    count = 0
    for valid in reports:
        count += 1
        r = valid.report
        senders[(r.job_id, valid.message.sender_id or "")] = None
        if r.launch_id is not None:
            seen_launch = launches.setdefault((r.job_id, r.run_attempt), r.launch_id)
            conflict = conflict or seen_launch != r.launch_id
        cp = checkpoint_row(valid)
        seen = checkpoints.get(cp.key)
        checkpoints[cp.key] = cp if seen is None else seen.merge(cp)
        shard = shard_row(valid)
        kept = shards.get(shard.key)
        if kept is None or shard.run_attempt > kept.run_attempt:
            shards[shard.key] = shard
            if r.launch_id is None:
                shard_launches.pop(shard.key, None)
            else:
                shard_launches[shard.key] = r.launch_id
    rows = tuple(shards[k] for k in sorted(shards))
    return BatchPlan(
        checkpoints=tuple(checkpoints[k] for k in sorted(checkpoints)),
        shards=rows,
        records=count,
        launch_conflict=conflict,
        senders=_job_senders(senders),
        launches=_launch_claims(rows, shard_launches),
    )


def _launch_claims(
    rows: Iterable[ShardRow], launch_of: dict[ShardKey, str]
) -> tuple[LaunchClaim, ...]:
    """The rows' (job, step, rank, run_attempt, launch), once per (job, step, attempt, launch):
    the rows 0014's trigger would check one by one, as few claims as the batch has steps."""
    first: dict[tuple[str, int, int, str], int] = {}
    for row in rows:
        launch = launch_of.get(row.key)
        if launch is not None:
            first.setdefault((row.job_id, row.step, row.run_attempt, launch), row.rank)
    return tuple((job, step, rank, attempt, launch)
                 for (job, step, attempt, launch), rank in first.items())  # fmt: skip


def _job_senders(pairs: Iterable[tuple[str, str]]) -> tuple[JobSender, ...]:
    """Each (job, principal) once, with the first SenderId seen for it, in delivery order."""
    first: dict[tuple[str, str], str] = {}
    for job, sender in pairs:
        first.setdefault((job, principal_of(sender)), sender)
    return tuple((job, owner, sender) for (job, owner), sender in first.items())
