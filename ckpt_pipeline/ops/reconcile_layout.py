"""Which checkpoint (step) and which rank each object of a store belongs to, and the world size
the layout names (pure).

The layouts our integrations and the frameworks write, by the path relative to the store's
prefix (``s3://bucket/prefix`` or ``file:///dir``):

* Hugging Face ``Trainer``: ``checkpoint-<step>/…`` (every file of the directory, one checkpoint;
  FSDP's DCP shards and DeepSpeed's ZeRO files inside it too), complete only with
  ``trainer_state.json``, which the process saving the shared state writes after the model and
  optimizer (an upload cut short by a rotation, or still running, may lack it);
* DCP (``torch.distributed.checkpoint``), torchtitan: a step directory (``step-<N>``,
  ``step_<N>``, ``step=<N>``, ``global_step<N>``, or Lightning's sharded ``…step=<N>….ckpt/``)
  holding ``__<rank>_<n>.distcp`` files and ``.metadata``, which DCP's coordinator writes last: a
  DCP directory without it is incomplete and is never taken for a checkpoint;
* DeepSpeed: a step directory holding ``zero_pp_rank_<r>_mp_rank_00_*_states.pt`` (its
  partition files, one set per data-parallel rank);
* one object per rank: a step directory holding ``rank-<r>``/``rank_<r>``/``rank<r>`` files;
* Lightning: ``…step=<N>….ckpt`` files (``epoch=3-step=1200.ckpt``), one file a checkpoint;
* anything else: a ``--pattern`` regular expression with a named group ``step`` (and optionally
  ``rank``), searched in the relative path; the checkpoint is the path up to the end of the
  ``step`` group.

Objects that match none (``last.ckpt``, logs) are not checkpoints and are left alone.

Which rank wrote which file, and what commits a checkpoint, are the integrations' own rules
(``trainer_client.storage.layouts``, ``trainer_client.storage.hf_layout``), so that what a
rank reports and what
a backfill reports for it are the same files: a name that carries a rank (DCP shards, ZeRO
partitions, the Trainer's ``rng_state_<r>.pth``, ``rank-<r>`` files) is that rank's; every other
file is rank 0's (DCP's coordinator, the process saving the Trainer's shared state). The world
size is the highest rank named plus one, ranks without gaps; the Trainer's ``rng_state.pth``
(no index) names a world of 1. A layout that names no rank (a Lightning file, a directory of
plain files, ``save_only_model``) names no world size: a backfill needs ``--world-size``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from trainer_client.exceptions import LayoutError
from trainer_client.storage.committed import (
    DCP_METADATA,
    HF_CHECKPOINT_DIR,
    LIGHTNING_NAME,
    STEP_DIR,
    committed_location,
)
from trainer_client.storage.hf_layout import process_index_in_name
from trainer_client.storage.layouts import rank_in_name

Layout = Literal[
    "hf",
    "incomplete-hf",
    "dcp",
    "incomplete-dcp",
    "deepspeed",
    "per-rank",
    "directory",
    "lightning",
    "pattern",
]

# The names are trainer_client.storage.committed's, the restart's too: here, where they stand.
_HF = re.compile(rf"(?:^|/)({HF_CHECKPOINT_DIR})/")
_STEP_DIR = re.compile(rf"(?:^|/)({STEP_DIR})/")
_LIGHTNING_DIR = re.compile(rf"(?:^|/)({LIGHTNING_NAME})/")
_DCP_SHARD = re.compile(r"^__(?P<rank>\d+)_\d+\.distcp$")
_RANK_FILE = re.compile(r"^rank[-_]?(?P<rank>\d+)(?:\.[A-Za-z0-9]+)*$")
_LIGHTNING = re.compile(rf"(?:^|/)({LIGHTNING_NAME})$")
_LIGHTNING_EPOCH = re.compile(r"(?:^|[-_/])epoch=(?P<epoch>\d+)")
_HF_WORLD_OF_ONE = "rng_state.pth"


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
    # rank -> its objects, for layouts that name ranks.
    ranks: dict[int, list[StoreObject]] = field(default_factory=dict)
    epoch: int = 0
    # The world size the layout names, or None with the reason it names none.
    world_size: int | None = None
    no_world_size: str = ""

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
    pattern_ranks: dict[str, int] = {}
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
            pattern_ranks[obj.relative] = rank
        epoch = _LIGHTNING_EPOCH.search(obj.relative)
        if epoch:
            checkpoint.epoch = int(epoch.group("epoch"))
    result = []
    for checkpoint in found.values():
        _settle_layout(checkpoint)
        _attribute(checkpoint, pattern_ranks)
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
    # The layout of a step directory is decided once all its objects are in (_settle_layout).
    for directory in (_STEP_DIR, _LIGHTNING_DIR):
        found = directory.search(relative)
        if found:
            return int(found.group("step")), "directory", relative[: found.end(1)] + "/", None
    lightning = _LIGHTNING.search(relative)
    if lightning:
        return int(lightning.group("step")), "lightning", relative, None
    return None


def _name(obj: StoreObject) -> str:
    return obj.relative.rsplit("/", 1)[-1]


def _settle_layout(checkpoint: StoreCheckpoint) -> None:
    """A step directory: DCP when it holds DCP shards or ``.metadata`` (incomplete without the
    commit marker), DeepSpeed with ZeRO partition files, per-rank with rank files, else a plain
    directory. An HF ``checkpoint-N`` without ``trainer_state.json`` is incomplete."""
    if checkpoint.layout == "hf":
        committed = any(
            committed_location(o.relative) == (checkpoint.step, checkpoint.location)
            for o in checkpoint.objects
        )
        checkpoint.layout = "hf" if committed else "incomplete-hf"
        return
    if checkpoint.layout != "directory":
        return
    names = {_name(o) for o in checkpoint.objects}
    if any(_DCP_SHARD.match(n) for n in names) or DCP_METADATA in names:
        # DCP's commit marker, in the step directory itself (Lightning's sharded step=N.ckpt/
        # included).
        metadata = checkpoint.location + DCP_METADATA
        committed = any(o.relative == metadata for o in checkpoint.objects)
        checkpoint.layout = "dcp" if committed else "incomplete-dcp"
    elif any("zero_pp_rank_" in n for n in names):
        checkpoint.layout = "deepspeed"
    elif any(_RANK_FILE.match(n) for n in names):
        checkpoint.layout = "per-rank"


def _attribute(checkpoint: StoreCheckpoint, pattern_ranks: dict[str, int]) -> None:
    """Each object's rank and the world size the layout names (see the module's docstring)."""
    if checkpoint.layout in ("lightning", "directory") or (
        checkpoint.layout == "pattern" and not pattern_ranks.keys() & _relatives(checkpoint)
    ):
        checkpoint.no_world_size = f"a {checkpoint.layout} layout names no ranks"
        return
    ranked: dict[int, list[StoreObject]] = {}
    world_of_one = False
    try:
        for obj in checkpoint.objects:
            rank = _rank_of(obj, checkpoint, pattern_ranks)
            if rank is not None:
                ranked.setdefault(rank, []).append(obj)
            world_of_one = world_of_one or (
                checkpoint.layout in ("hf", "incomplete-hf") and _name(obj) == _HF_WORLD_OF_ONE
            )
    except LayoutError as exc:
        checkpoint.no_world_size = str(exc)
        return
    if not ranked and not world_of_one:
        checkpoint.no_world_size = (
            "no file names a rank (no rng_state_<rank>.pth, DCP shards or ZeRO partitions:"
            " save_only_model?)"
        )
        return
    # Files that carry no rank are rank 0's: DCP's coordinator, the Trainer's shared state.
    owned = {id(o) for objs in ranked.values() for o in objs}
    rest = [o for o in checkpoint.objects if id(o) not in owned]
    if rest or not ranked:
        ranked.setdefault(0, []).extend(rest)
    world = max(ranked) + 1
    if sorted(ranked) != list(range(world)):
        checkpoint.no_world_size = f"ranks {sorted(ranked)} named, with gaps"
        return
    checkpoint.ranks = dict(sorted(ranked.items()))
    checkpoint.world_size = world


def _relatives(checkpoint: StoreCheckpoint) -> set[str]:
    return {o.relative for o in checkpoint.objects}


def _rank_of(
    obj: StoreObject, checkpoint: StoreCheckpoint, pattern_ranks: dict[str, int]
) -> int | None:
    """The rank ``obj``'s name carries in its layout, or None (raises LayoutError for a
    model-parallel DeepSpeed file, which no rank can be vouched for)."""
    if checkpoint.layout == "pattern":
        return pattern_ranks.get(obj.relative)
    inside = obj.relative[len(checkpoint.location) :]
    rank = rank_in_name(inside)
    if rank is None and checkpoint.layout in ("hf", "incomplete-hf"):
        rank = process_index_in_name(inside)
    if rank is None and checkpoint.layout == "per-rank":
        match = _RANK_FILE.match(_name(obj))
        rank = None if match is None else int(match.group("rank"))
    return rank
