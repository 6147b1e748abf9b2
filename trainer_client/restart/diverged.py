"""Checkpoints of a diverged run: recorded as trained on a non-finite loss, skipped by a resume.

The integrations record a NaN or infinite training loss as absent, with what it was in the shard
row's ``extra.non_finite`` (``{"loss": "nan"}``; the contract refuses a non-finite number, and
an absent loss is never the best one). A checkpoint so marked on any of its ranks holds weights
trained on that loss: resuming there only trains NaN further. So the resume walk
(:func:`trainer_client.restart.lookup.first_verified`) passes over it by default, and says
so in one line whatever the logging setup; ``resume_diverged=True`` resumes from it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from trainer_client._log import warn_visibly
from trainer_client.report._fields import NON_FINITE_FIELD
from trainer_client.restart.shard_rows import ShardRows
from trainer_client.storage.verify import ShardRecord

_log = logging.getLogger(__name__)

# A diverged run may leave hundreds of checkpoints after its NaN: the line names the newest few.
STEPS_NAMED = 5


def non_finite_loss(shards: Mapping[int, ShardRecord]) -> str | None:
    """``"rank R: loss=nan"`` when a shard row records a non-finite loss, else None. The joined
    extras are searched first, so a checkpoint without the mark decodes nothing."""
    if isinstance(shards, ShardRows) and not shards.may_hold(f'"{NON_FINITE_FIELD}"'):
        return None
    for rank, shard in sorted(shards.items()):
        marks = shard.extra.get(NON_FINITE_FIELD)
        if isinstance(marks, Mapping) and "loss" in marks:
            return f"rank {rank}: loss={marks['loss']}"
    return None


def say_skipped(job_id: str, skipped: list[tuple[int, str]]) -> None:
    """One line on stderr naming the checkpoints a walk passed over (newest first), if any."""
    if not skipped:
        return
    steps = [step for step, _ in skipped]
    shown = ", ".join(str(step) for step in steps[:STEPS_NAMED])
    more = f" and {len(steps) - STEPS_NAMED} older" if len(steps) > STEPS_NAMED else ""
    warn_visibly(
        _log,
        "job %s: step%s %s%s skipped, trained on a non-finite loss (extra.%s; step %s %s);"
        " resuming from an older checkpoint (resume_diverged=True resumes from them)",
        job_id,
        "s" if len(steps) > 1 else "",
        shown,
        more,
        NON_FINITE_FIELD,
        *skipped[0],
    )
