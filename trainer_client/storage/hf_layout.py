"""Which files of a Trainer's ``checkpoint-N`` each process wrote, hence reports (pure rules).

What each process writes into ``checkpoint-N`` (transformers 5.24 / accelerate 1.16 source):

* the process with ``args.should_save`` (process 0; local process 0 of each node with
  ``save_on_each_node``): the model (``save_pretrained``), ``training_args.bin``, the optimizer,
  scheduler and scaler, ``trainer_state.json``, and its own RNG state;
* every other process: ``rng_state_{process_index}.pth`` (nothing with ``save_only_model``);
* FSDP with ``SHARDED_STATE_DICT``: every process also writes its DCP shard files
  ``pytorch_model_fsdp_0/__{rank}_*.distcp`` and ``optimizer_0/__{rank}_*.distcp`` (process 0 the
  ``.metadata``); with per-rank saves ``*_rank{rank}.bin``; with ``FULL_STATE_DICT`` process 0
  writes everything.
* DeepSpeed (ZeRO 0-3): the engine's ``save_checkpoint(checkpoint-N)`` writes
  ``global_step{N}/*zero_pp_rank_{r}_mp_rank_00_*_states.pt`` on every process ``r`` (its
  data-parallel rank), ``mp_rank_00_model_states.pt`` (ZeRO 0-2), ``latest`` and the
  ``zero_to_fp32.py`` script on process 0, and ends with a barrier.

So a file whose name carries a process index belongs to that process (DCP's and DeepSpeed's names:
``trainer_client.storage.layouts``), the savers' commit markers (DCP's ``.metadata``,
DeepSpeed's ``latest``) to process 0, and every other file to the process that saves the shared
state.
A process whose ``_save_checkpoint`` returned must also find the files it always writes
(:func:`required_files`) and, as process 0, the commit markers; without them its part is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainer_client.exceptions import IntegrationError, LayoutError
from trainer_client.storage.layouts import missing_files, writer_of

# The Trainer's RNG state (Trainer._save_rng_state): one file with one process, else one per
# process index. The restart reads them too (trainer_client/restart/world.py).
RNG_STATE_ALONE = "rng_state.pth"
RNG_STATE_PER_PROCESS = re.compile(r"^rng_state_(\d+)\.pth$")
# File names of the Trainer's own that carry the index of the process that wrote them; DCP's and
# DeepSpeed's names are read by trainer_client.storage.layouts.
_RANK_MARKED = (
    RNG_STATE_PER_PROCESS,
    re.compile(r"_rank(\d+)\.bin$"),  # accelerate's per-rank FSDP saves (use_dcp=False, LOCAL)
)
TRAINER_STATE_NAME = "trainer_state.json"


def process_index_in_name(relative: str) -> int | None:
    """The process index a file name of the Trainer's own carries (``rng_state_1.pth``,
    ``*_rank1.bin``), or None."""
    name = relative.rsplit("/", 1)[-1]
    for pattern in _RANK_MARKED:
        match = pattern.search(name)
        if match:
            return int(match.group(1))
    return None


def owner_of(relative: str, *, process_index: int, should_save: bool) -> bool:
    """Whether the file ``relative`` (to ``checkpoint-N``) was written by this process.

    Raises ``LayoutError`` for a DeepSpeed file of a model-parallel rank other than 00.
    """
    marked = process_index_in_name(relative)
    if marked is not None:
        return marked == process_index
    # DCP shards by rank, ZeRO files by data-parallel rank (= process index without model
    # parallelism); .metadata, latest and rank 0's model states by process 0 whoever saves.
    writer = writer_of(relative)
    return writer == process_index if writer is not None else should_save


def required_files(
    *, process_index: int, world_size: int, should_save: bool, save_only_model: bool
) -> list[str]:
    """The files this process must have written when its ``_save_checkpoint`` returned."""
    required: list[str] = []
    if not save_only_model:
        required.append(RNG_STATE_ALONE if world_size <= 1 else f"rng_state_{process_index}.pth")
    if should_save:
        required.append(TRAINER_STATE_NAME)
    return required


def files_written_by_process(
    directory: Path,
    present: list[str],
    *,
    process_index: int,
    world_size: int,
    should_save: bool,
    save_only_model: bool,
) -> list[str]:
    """The files of ``present`` (relative to ``directory``) that this process wrote.

    Raises ``IntegrationError`` when one it must have written is missing (its part of the save
    did not happen, or did not commit) or the layout is one we do not report.
    """
    try:
        files = [
            f for f in present if owner_of(f, process_index=process_index, should_save=should_save)
        ]
        # The layout's own needs: this process's DCP/ZeRO shards, and from process 0 each
        # DCP directory's .metadata and DeepSpeed's latest (the saves' commit markers).
        missing = missing_files(present, rank=process_index)
    except LayoutError as exc:
        raise IntegrationError("checkpoint", str(exc)) from None
    missing += [
        name
        for name in required_files(
            process_index=process_index,
            world_size=world_size,
            should_save=should_save,
            save_only_model=save_only_model,
        )
        if name not in files
    ]
    if missing:
        raise IntegrationError(
            "checkpoint", f"{directory} lacks {', '.join(missing)}, which this process writes"
        )
    return files
