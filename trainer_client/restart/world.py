"""A restart at another world size than the checkpoint was saved at: what each framework's state
does then, said in one line, never dropped in silence.

Read from the checkpoint's file names (the decision's objects, or the local directory):

* **DeepSpeed ZeRO** (``*zero_pp_rank_N_mp_rank_*_optim_states.pt``): each data-parallel rank's
  optimizer partition; DeepSpeed loads them only at the world size that saved them (without a
  universal checkpoint). The restart refuses on every rank, before anything is fetched.
* **RNG state per rank** (the HF ``Trainer``'s ``rng_state_N.pth``): a process loads its own
  index's file (one process loads ``rng_state.pth``); files of ranks that no longer exist are
  not loaded, and ranks without a file start from a fresh RNG state: one line names them.
* **DCP** (``.metadata``): the load plan reads whichever shards each rank's state needs, so it
  reshards; a single file (Lightning's DDP ``.ckpt``) holds the whole state: one line says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from trainer_client._log import say
from trainer_client.exceptions import ResumeError
from trainer_client.restart.decide import Decision
from trainer_client.storage.committed import DCP_METADATA
from trainer_client.storage.hf_layout import RNG_STATE_ALONE, RNG_STATE_PER_PROCESS
from trainer_client.storage.layouts import DEEPSPEED_ZERO

_log = logging.getLogger("trainer_client.restart.resume")


def _name(relative: str) -> str:
    return relative.rsplit("/", 1)[-1]


def _zero_partitions(names: Iterable[str]) -> set[int]:
    """The data-parallel ranks of the ZeRO optimizer partitions among ``names``."""
    found = (DEEPSPEED_ZERO.search(_name(n)) for n in names)
    return {int(m.group(1)) for m in found if m and m.group(3) == "optim"}


def _rng_ranks(names: Iterable[str]) -> set[int]:
    """The process indexes of the per-process RNG state files among ``names``."""
    found = (RNG_STATE_PER_PROCESS.match(_name(n)) for n in names)
    return {int(m.group(1)) for m in found if m}


def names_in(path: str) -> list[str]:
    """The files of a local checkpoint, relative to it ("" for one file; [] when not here)."""
    root = Path(path)
    if root.is_file():
        return [""]
    if not root.is_dir():
        return []
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]


def refusal(names: Iterable[str], *, step: int, saved: int, now: int) -> str | None:
    """Why this checkpoint cannot be loaded at ``now`` ranks, or None (pure)."""
    partitions = _zero_partitions(names)
    if saved == now or not partitions:
        return None
    return (
        f"step {step} was saved by {saved} ranks as DeepSpeed ZeRO partitions ({len(partitions)} "
        f"zero_pp_rank_*_optim_states.pt) and this launch has {now} ranks: DeepSpeed loads them "
        f"only at the world size that saved them. Relaunch with {saved} ranks, or convert the "
        "checkpoint with DeepSpeed's ds_to_universal.py and load it with "
        '"checkpoint": {"load_universal": true}'
    )


def note(names: Iterable[str], *, step: int, saved: int, now: int) -> str | None:
    """What follows the ranks when ``saved`` != ``now`` (one line), or None (pure)."""
    if saved == now:
        return None
    listed = list(names)
    head = f"step {step} was saved by {saved} ranks and this launch has {now}: "
    rng = sorted(_rng_ranks(listed))
    if rng:
        # The HF Trainer: one process loads rng_state.pth, process i of several rng_state_i.pth.
        single = any(_name(n) == RNG_STATE_ALONE for n in listed)
        orphans = rng if now == 1 else [r for r in rng if r >= now]
        fresh = ([] if single else [0]) if now == 1 else [r for r in range(now) if r not in rng]
        parts = []
        if orphans:
            files = ", ".join(f"rng_state_{r}.pth" for r in orphans)
            parts.append(f"the RNG state of saved rank(s) {_ranks(orphans)} ({files}) has no rank")
        if fresh:
            parts.append(f"rank(s) {_ranks(fresh)} start from a fresh RNG state")
        if parts:
            return head + "; ".join(parts) + " (the model and optimizer state load whole)"
    if any(_name(n) == DCP_METADATA for n in listed):
        return head + "DCP reshards it on load (every rank's shards are fetched)"
    if listed == [""]:
        return head + "one file holds the whole state"
    return None


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def check_world_size(job_id: str, decision: Decision, now: int, *, speaks: bool) -> None:
    """At another world size than the checkpoint's: refuse on every rank, before anything is
    fetched, where the framework cannot load it; else one line (``speaks``: rank 0) saying what
    follows the ranks."""
    point = decision.point
    assert point is not None
    if point.world_size == now:
        return
    names = [o.relative for o in decision.objects] if decision.objects else names_in(point.path)
    why = refusal(names, step=point.step, saved=point.world_size, now=now)
    if why is not None:
        raise ResumeError("world_size", why)
    line = note(names, step=point.step, saved=point.world_size, now=now)
    if speaks and line is not None:
        say(_log, logging.WARNING, "job %s: %s", job_id, line)
