"""What a committed checkpoint is named, and how to find one in a listing: the one place.

The restart (a newer checkpoint in the store than in the database) and ``ckpt-pipeline
reconcile`` (which objects form which checkpoint) read these names; no other module spells them.
The names, as the frameworks write them:

* the Hugging Face ``Trainer``'s ``checkpoint-<step>/``, committed by ``trainer_state.json``
  (written after the model and optimizer);
* a step directory (``step-<N>``, ``step_<N>``, ``step=<N>``, ``global_step<N>``: DCP,
  torchtitan, DeepSpeed), committed by DCP's ``.metadata`` (its coordinator writes it last);
* a Lightning file, ``step=<N>`` as one ``-``/``_``-separated part of its name
  (``epoch=3-step=1200.ckpt``, ``step=5-v1.ckpt``), renamed into place whole. ``mystep=5.ckpt``
  (another metric) and ``step=5x.ckpt`` (no step number) are not checkpoints.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# The name of one path segment, each with the named group ``step``.
HF_CHECKPOINT_DIR = r"checkpoint-(?P<step>\d+)"
STEP_DIR = r"(?:global_)?step[-_=]?(?P<step>\d+)"
LIGHTNING_NAME = r"(?:[^/]*[-_])?step=(?P<step>\d+)(?:[-_.][^/]*)?\.ckpt"

HF_TRAINER_STATE = "trainer_state.json"
DCP_METADATA = ".metadata"

# A commit marker's path relative to the checkpoints' parent: ``loc`` the checkpoint's location.
COMMITTED = (
    re.compile(rf"^(?P<loc>(?:.*/)?{HF_CHECKPOINT_DIR}/){re.escape(HF_TRAINER_STATE)}$"),
    re.compile(rf"^(?P<loc>(?:.*/)?{STEP_DIR}/){re.escape(DCP_METADATA)}$"),
    re.compile(rf"^(?P<loc>(?:.*/)?{LIGHTNING_NAME})$"),
)


def committed_location(relative: str) -> tuple[int, str] | None:
    """(step, location) of the checkpoint whose commit marker ``relative`` is, or None."""
    for pattern in COMMITTED:
        match = pattern.match(relative)
        if match is not None:
            return int(match.group("step")), match.group("loc")
    return None


def newest_committed(relatives: Iterable[str], *, above: int = -1) -> tuple[int, str] | None:
    """The newest committed checkpoint (step, location) in a listing (paths relative to the
    checkpoints' parent) whose step is above ``above``, or None."""
    best: tuple[int, str] | None = None
    for relative in relatives:
        found = committed_location(relative)
        if found is not None and found[0] > above and (best is None or found[0] > best[0]):
            best = found
    return best
