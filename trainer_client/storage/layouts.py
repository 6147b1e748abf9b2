"""Who wrote which file of a sharded checkpoint, and what a rank must find before it reports.

Pure functions over relative file names (no I/O, no framework imports), shared by the plain
torch, Lightning and Hugging Face integrations. The layouts, as the frameworks write them
(torch 2.13, DeepSpeed 0.19, Lightning 2.6, transformers 5.24 / accelerate 1.16):

* **DCP** (``torch.distributed.checkpoint``'s ``FileSystemWriter``): every rank writes
  ``__<rank>_<n>.distcp``; the coordinator (rank 0) writes ``.metadata`` last, after gathering
  every rank's write results. ``.metadata`` is the commit marker: without it the directory does
  not load, whatever shards are there. Lightning's ``FSDPStrategy`` (sharded) and
  ``ModelParallelStrategy`` add ``meta.pt`` (rank 0, the trainer state); accelerate's FSDP
  ``SHARDED_STATE_DICT`` puts DCP directories ``pytorch_model_fsdp_0/`` and ``optimizer_0/``
  inside ``checkpoint-N/``.
* **DeepSpeed** (``engine.save_checkpoint(save_dir, tag)``): in ``save_dir/<tag>/`` the rank of
  data-parallel index *d* writes ``zero_pp_rank_<d>_mp_rank_<mm>_optim_states.pt`` (ZeRO 1-3;
  ``bf16_`` prefixed with bf16) and, with ZeRO 3, ``zero_pp_rank_<d>_mp_rank_<mm>_model_states.pt``;
  data-parallel rank 0 writes ``mp_rank_<mm>_model_states.pt`` (ZeRO 0-2); global rank 0 copies
  ``zero_to_fp32.py`` into ``save_dir`` and writes ``save_dir/latest`` (the tag) once its own
  files are written. The save ends with a barrier, so when it returns on any rank every rank's
  files exist. ``latest`` is what a load without a tag reads: the commit marker.

Ownership is by name: a file whose name carries a rank belongs to that rank; every other file to
the coordinator (rank 0, or the process that saves the shared state in the Hugging Face
``Trainer``). A data-parallel index equals the global rank only without model parallelism
(``mp_rank_00``); a file of another model-parallel rank is refused rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from trainer_client.exceptions import LayoutError
from trainer_client.storage.committed import DCP_METADATA

DCP_SUFFIX = ".distcp"
LIGHTNING_META = "meta.pt"
DEEPSPEED_LATEST = "latest"

_DCP_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
# A DeepSpeed ZeRO file of one data-parallel rank (searched in a file's name: ``bf16_`` and other
# prefixes are allowed); groups: data-parallel rank, model-parallel rank, "optim" or "model". The
# restart reads its optimizer partitions with it too (trainer_client/restart/world.py).
DEEPSPEED_ZERO = re.compile(r"zero_pp_rank_(\d+)_mp_rank_(\d+)_(optim|model)_states\.pt$")
_DEEPSPEED_MODEL = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
# Written by global rank 0 alone, even where other processes save shared state (HF's
# save_on_each_node): DCP's coordinator, DeepSpeed's commit and its recovery scripts.
_RANK_ZERO_NAMES = frozenset(
    {DCP_METADATA, DEEPSPEED_LATEST, "zero_to_fp32.py", "zero_to_torch.py"}
)


def _split(relative: str) -> tuple[str, str]:
    directory, _, name = relative.rpartition("/")
    return directory, name


def rank_in_name(relative: str) -> int | None:
    """The rank a DCP or DeepSpeed file name carries, or None for a file with no rank in it."""
    name = _split(relative)[1]
    match = _DCP_SHARD.match(name)
    if match:
        return int(match.group(1))
    match = DEEPSPEED_ZERO.search(name)
    if match:
        if int(match.group(2)) != 0:
            raise LayoutError(
                f"{relative}: a model-parallel rank other than 00; only data-parallel "
                "DeepSpeed saves (mp_rank_00) are attributed to ranks"
            )
        return int(match.group(1))
    match = _DEEPSPEED_MODEL.match(name)
    if match and int(match.group(1)) != 0:
        raise LayoutError(f"{relative}: a model-parallel rank other than 00 (see above)")
    return None


def writer_of(relative: str) -> int | None:
    """The rank that writes ``relative``: the one in its name; 0 for what only global rank 0
    writes (DCP's ``.metadata``, DeepSpeed's ``latest``, scripts and rank-0 model states);
    None for a file of whichever process saves the framework's shared state."""
    marked = rank_in_name(relative)
    if marked is not None:
        return marked
    name = _split(relative)[1]
    if name in _RANK_ZERO_NAMES or _DEEPSPEED_MODEL.match(name):
        return 0
    return None


def own_files(files: Iterable[str], *, rank: int, saves_shared: bool) -> list[str]:
    """The files of ``files`` (relative paths) that ``rank`` wrote; ``saves_shared``: this rank
    also writes the files that carry no rank (rank 0; HF's ``args.should_save``)."""
    owned = []
    for relative in files:
        writer = writer_of(relative)
        if (writer == rank) if writer is not None else saves_shared:
            owned.append(relative)
    return sorted(owned)


def _dcp_directories(files: Iterable[str]) -> set[str]:
    return {_split(f)[0] for f in files if _split(f)[1].endswith(DCP_SUFFIX)}


def _deepspeed_tags(files: Iterable[str]) -> set[str]:
    return {
        _split(f)[0]
        for f in files
        if DEEPSPEED_ZERO.search(_split(f)[1]) or _DEEPSPEED_MODEL.match(_split(f)[1])
    }


def missing_files(files: Iterable[str], *, rank: int) -> list[str]:
    """What ``rank`` must have found in the checkpoint but did not (empty: it may report).

    Read from the layout itself: every DCP directory in the checkpoint needs this rank's shard
    and, from rank 0 (the coordinator), its ``.metadata``; every DeepSpeed tag directory needs
    this rank's ZeRO files when any rank wrote some, and, from rank 0, ``latest`` beside it.
    Rank 0's markers are written after every shard, so a rank 0 that reports vouches that the
    save committed; without its report the checkpoint never counts as complete.
    """
    present = set(files)
    missing: list[str] = []
    for directory in sorted(_dcp_directories(present)):
        prefix = f"{directory}/" if directory else ""
        if not any(
            _split(f)[0] == directory and rank_in_name(f) == rank and f.endswith(DCP_SUFFIX)
            for f in present
        ):
            missing.append(f"{prefix}__{rank}_*{DCP_SUFFIX}")
        if rank == 0 and f"{prefix}{DCP_METADATA}" not in present:
            missing.append(f"{prefix}{DCP_METADATA}")
    for tag in sorted(_deepspeed_tags(present)):
        in_tag = [f for f in present if _split(f)[0] == tag]
        kinds = {m.group(3) for f in in_tag if (m := DEEPSPEED_ZERO.search(_split(f)[1]))}
        for kind in sorted(kinds):
            if not any(
                rank_in_name(f) == rank and f.endswith(f"_{kind}_states.pt") for f in in_tag
            ):
                missing.append(f"{tag}/*zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt")
        parent = tag.rpartition("/")[0]
        latest = f"{parent}/{DEEPSPEED_LATEST}" if parent else DEEPSPEED_LATEST
        if rank == 0 and latest not in present:
            missing.append(latest)
    return missing


def deepspeed_config_refusal(config: Mapping[str, Any]) -> str | None:
    """Why a DeepSpeed config saves in a way no integration can vouch for, or None.

    A ``checkpoint.writer`` (FastPersist, decoupled writers), DataStates or Nebula engine writes
    and commits in the background after ``save_checkpoint`` returned, with no completion this
    code can observe: a report after the call could claim files still being written.
    """
    writer = config.get("checkpoint", {}).get("writer") if isinstance(config, Mapping) else None
    if writer:
        return "its checkpoint.writer engine writes after save_checkpoint returns"
    datastates = config.get("datastates_ckpt")
    if datastates is not None and datastates is not False:
        return "its datastates_ckpt engine writes after save_checkpoint returns"
    nebula = config.get("nebula")
    if isinstance(nebula, Mapping) and nebula.get("enabled"):
        return "its nebula engine writes after save_checkpoint returns"
    return None
