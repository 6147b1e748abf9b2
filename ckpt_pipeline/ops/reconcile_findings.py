"""What ``reconcile`` found and what ``--backfill`` would send (pure: no store, no database)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ckpt_pipeline.ops.reconcile_layout import StoreCheckpoint, StoreObject
from trainer_client.storage.verify import ShardRecord


@dataclass
class Disagreement:
    """One checkpoint that the store and the database disagree about."""

    kind: str  # "unreported", "partial", "differs", "in-flight", "pruned"
    step: int
    where: str
    detail: str
    layout: str | None = None
    reports: int = 0


@dataclass
class Reconciliation:
    """Everything one run found, and what it sent."""

    job_id: str
    store: str
    in_store: int = 0
    with_rows: int = 0
    rows_elsewhere: int = 0
    # One object URI of a row elsewhere: where the job's checkpoints are, for a mistyped --store.
    elsewhere_example: str = ""
    findings: list[Disagreement] = field(default_factory=list)
    backfilled: int = 0
    dry_run: bool = True

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f.kind == kind)

    def summary(self) -> str:
        sent = f"backfilled {self.backfilled} reports" if not self.dry_run else "dry run"
        return (
            f"reconcile job {self.job_id} store {self.store}: {self.in_store} checkpoints in the"
            f" store, {self.with_rows} with rows; {self.count('unreported')} unreported,"
            f" {self.count('partial')} partial, {self.count('differs')} differing,"
            f" {self.count('in-flight')} in flight,"
            f" {self.count('pruned')} pruned,"
            f" {self.rows_elsewhere} rows elsewhere; {sent}"
        )

    def as_json(self) -> str:
        return json.dumps({**asdict(self), "summary": self.summary()}, indent=2)


@dataclass(frozen=True)
class Backfill:
    """What ``--backfill`` reports for one checkpoint: these ranks of this world size, at this
    attempt (None: the ``--run-attempt`` option's) and launch."""

    checkpoint: StoreCheckpoint
    ranks: tuple[int, ...]
    world_size: int
    run_attempt: int | None = None
    # A partial checkpoint's: its rows' launch, so that the writer checks the backfilled rank
    # against it as against any report of that launch (None: the rows carry none).
    launch_id: str | None = None


def world_size_of(checkpoint: StoreCheckpoint, option: int | None) -> int | str:
    """The world size a backfill of ``checkpoint`` reports, or why there is none (``option``:
    ``--world-size``, for a layout that names none; refused when the layout names another)."""
    named = checkpoint.world_size
    if named is None:
        if option is None:
            return f"the layout names no world size ({checkpoint.no_world_size}): give --world-size"
        return option
    if option is not None and option != named:
        return f"the layout names world size {named}, not --world-size {option}"
    return named


def unreported_ranks(
    checkpoint: StoreCheckpoint, shards: list[ShardRecord], recorded: int, world: int | str
) -> tuple[list[int], str] | None:
    """A checkpoint with rows: the ranks its layout names that have no row of its attempt
    (``shards``; ``recorded`` its world size), and why they cannot be backfilled ("" when they
    can); None when every rank has a row, or the layout names no ranks to judge by."""
    if isinstance(world, str) or not checkpoint.ranks:
        return None
    reported = {s.rank for s in shards}
    missing = [r for r in range(max(world, recorded)) if r not in reported]
    if world != recorded:
        return missing, f"the layout names world size {world}, its rows {recorded}"
    return (missing, "") if missing else None


def in_flight(
    checkpoint: StoreCheckpoint,
    parts: list[StoreObject],
    uploading: set[str],
    *,
    now_s: float,
    min_age_s: float,
) -> str:
    """Why ``parts`` of ``checkpoint`` may still be on their way ("" when they are not): not
    committed yet, a multipart upload open under it, or written less than ``min_age_s`` ago."""
    if checkpoint.layout == "incomplete-dcp":
        return "DCP directory without .metadata (not a checkpoint yet)"
    if checkpoint.layout == "incomplete-hf":
        return "checkpoint directory without trainer_state.json (not a checkpoint yet)"
    busy = sorted(k for k in uploading if k.startswith(checkpoint.location))
    if busy:
        return f"multipart upload open for {busy[0]}"
    newest = max((o.modified_s for o in parts), default=0.0)
    if now_s - newest < min_age_s:
        return f"written {now_s - newest:.0f} s ago (< --min-age)"
    return ""
