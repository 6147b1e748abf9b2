"""Which checkpoint (step) and which rank each object of a store belongs to (pure).

The layouts our integrations and the frameworks write, by the path relative to the store's
prefix (``s3://bucket/prefix`` or ``file:///dir``):

* Hugging Face ``Trainer``: ``checkpoint-<step>/…`` (every file of the directory, one checkpoint;
  FSDP's DCP shards inside it too), complete only with ``trainer_state.json``, which the process
  saving the shared state writes after the model and optimizer (an upload cut short by a
  rotation, or still running, may lack it);
* DCP (``torch.distributed.checkpoint``), torchtitan, DeepSpeed: a step directory
  (``step-<N>``, ``step_<N>``, ``step=<N>``, ``global_step<N>``) holding ``__<rank>_<n>.distcp``
  files and ``.metadata``, which DCP's coordinator writes last: a DCP directory without it is
  incomplete and is never taken for a checkpoint;
* one object per rank: a step directory holding ``rank-<r>``/``rank_<r>``/``rank<r>`` files;
* Lightning: ``…step=<N>….ckpt`` files (``epoch=3-step=1200.ckpt``), one file a checkpoint;
* anything else: a ``--pattern`` regular expression with a named group ``step`` (and optionally
  ``rank``), searched in the relative path; the checkpoint is the path up to the end of the
  ``step`` group.

Objects that match none (``last.ckpt``, logs) are not checkpoints and are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Layout = Literal[
    "hf", "incomplete-hf", "dcp", "incomplete-dcp", "per-rank", "directory", "lightning", "pattern"
]

_HF = re.compile(r"(?:^|/)(checkpoint-(?P<step>\d+))/")
_STEP_DIR = re.compile(r"(?:^|/)((?:global_)?step[-_=]?(?P<step>\d+))/")
_DCP_SHARD = re.compile(r"^__(?P<rank>\d+)_\d+\.distcp$")
_RANK_FILE = re.compile(r"^rank[-_]?(?P<rank>\d+)(?:\.[A-Za-z0-9]+)*$")
_LIGHTNING = re.compile(r"(?:^|[-_/])step=(?P<step>\d+)(?:[-_.][^/]*)?\.ckpt$")
_LIGHTNING_EPOCH = re.compile(r"(?:^|[-_/])epoch=(?P<epoch>\d+)")
_DCP_METADATA = ".metadata"
_HF_STATE = "trainer_state.json"


@dataclass(frozen=True)
class StoreObject:
    """One object of the store: its path relative to the prefix, full URI and listing facts."""

    relative: str
    uri: str
    bytes: int
    modified_s: float


@dataclass
class StoreCheckpoint:
    """The objects of one checkpoint found in the store."""

    step: int
    layout: Layout
    # The checkpoint's location relative to the prefix: a directory ("…/") or one file.
    location: str
    objects: list[StoreObject] = field(default_factory=list)
    # rank -> its objects, for layouts with one file (or more) per rank.
    ranks: dict[int, list[StoreObject]] = field(default_factory=dict)
    epoch: int = 0

    @property
    def bytes(self) -> int:
        return sum(o.bytes for o in self.objects)

    @property
    def newest_modified_s(self) -> float:
        return max((o.modified_s for o in self.objects), default=0.0)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``--pattern``: a regular expression with a named group ``step``; ValueError otherwise."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    if "step" not in compiled.groupindex:
        raise ValueError("needs a named group (?P<step>\\d+)")
    return compiled


def group_checkpoints(
    objects: Iterable[StoreObject], *, pattern: re.Pattern[str] | None = None
) -> list[StoreCheckpoint]:
    """The checkpoints the objects form, by step; objects of no checkpoint are left out."""
    found: dict[tuple[int, str], StoreCheckpoint] = {}
    for obj in objects:
        placed = _place(obj.relative, pattern)
        if placed is None:
            continue
        step, layout, location, rank = placed
        checkpoint = found.setdefault(
            (step, location), StoreCheckpoint(step=step, layout=layout, location=location)
        )
        checkpoint.objects.append(obj)
        if rank is not None:
            checkpoint.ranks.setdefault(rank, []).append(obj)
        epoch = _LIGHTNING_EPOCH.search(obj.relative)
        if epoch:
            checkpoint.epoch = int(epoch.group("epoch"))
    result = []
    for checkpoint in found.values():
        _settle_layout(checkpoint)
        result.append(checkpoint)
    return sorted(result, key=lambda c: (c.step, c.location))


def _place(
    relative: str, pattern: re.Pattern[str] | None
) -> tuple[int, Layout, str, int | None] | None:
    if pattern is not None:
        match = pattern.search(relative)
        if match is None:
            return None
        rank = match.groupdict().get("rank")
        location = relative[: match.end("step")]
        if match.end("step") < len(relative) and relative[match.end("step")] == "/":
            location += "/"
        return int(match.group("step")), "pattern", location, None if rank is None else int(rank)
    hf = _HF.search(relative)
    if hf:
        return int(hf.group("step")), "hf", relative[: hf.end(1)] + "/", None
    step_dir = _STEP_DIR.search(relative)
    if step_dir:
        location = relative[: step_dir.end(1)] + "/"
        name = relative.rsplit("/", 1)[-1]
        rank = _DCP_SHARD.match(name) or _RANK_FILE.match(name)
        # The layout of a step directory is decided once all its objects are in (_settle_layout).
        step = int(step_dir.group("step"))
        return step, "directory", location, None if rank is None else int(rank.group("rank"))
    lightning = _LIGHTNING.search(relative)
    if lightning:
        return int(lightning.group("step")), "lightning", relative, None
    return None


def _settle_layout(checkpoint: StoreCheckpoint) -> None:
    """A step directory: DCP when it holds DCP shards or ``.metadata`` (incomplete without the
    latter), per-rank when it holds rank files, else a plain directory. Objects outside the
    ranks' own files (``.metadata``, shared files) belong to rank 0, DCP's coordinator. An HF
    ``checkpoint-N`` without ``trainer_state.json`` is incomplete."""
    if checkpoint.layout == "hf":
        names = {o.relative.rsplit("/", 1)[-1] for o in checkpoint.objects}
        if _HF_STATE not in names:
            checkpoint.layout = "incomplete-hf"
        return
    if checkpoint.layout != "directory":
        return
    names = {o.relative.rsplit("/", 1)[-1] for o in checkpoint.objects}
    if _DCP_METADATA in names:
        checkpoint.layout = "dcp"
    elif any(_DCP_SHARD.match(n) for n in names):
        checkpoint.layout = "incomplete-dcp"
    elif checkpoint.ranks:
        checkpoint.layout = "per-rank"
    if checkpoint.ranks:
        owned = {o.relative for objs in checkpoint.ranks.values() for o in objs}
        rest = [o for o in checkpoint.objects if o.relative not in owned]
        checkpoint.ranks.setdefault(0, []).extend(rest)
