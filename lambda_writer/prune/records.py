"""The one typed record retention reads, plans and lists: a job's checkpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint of a job as retention reads it (``training_checkpoints``, its shard counts
    and, with a metric, its value): what ``checkpoints`` lists and what the planner plans over.
    The planner reads neither ``epoch`` nor ``shards_present``."""

    step: int
    run_attempt: int
    world_size: int
    is_complete: bool
    shard_rows: int
    superseded_rows: int = 0
    value: float | None = None
    epoch: int = 0
    shards_present: int = 0
