"""Lightning's ``FSDPStrategy.save_checkpoint`` on CPU: the strategy's own save code, two ranks.

Lightning refuses ``FSDPStrategy`` with a CPU accelerator and FSDP1 needs a GPU, so no CPU job
can train with it; its save path does not need either: given a checkpoint dict of tensors it
writes its real layout (``_distributed_checkpoint_save`` + ``meta.pt``, or one file through
``checkpoint_io``). Each rank saves both kinds, then writes ``result-<rank>.json``: the layout
``save_layout`` names for each strategy, the files ``rank_files`` gives it (what it would hand
to its finisher), and the paths its CheckpointIO wrote.

Usage: ``python -m tests.integrations.lightning_fsdp_save <out_dir>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.strategies import FSDPStrategy

from tests.integrations.ranks import fork_ranks
from trainer_client.integrations._lightning_layout import rank0_required, save_layout
from trainer_client.integrations.sharded import rank_files


class RecordingIO(TorchCheckpointIO):
    """Lightning's own IO, remembering what it wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[str] = []

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        self.written.append(str(path))


def run_rank(rank: int, out: Path) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result: dict[str, Any] = {}
    for kind in ("sharded", "full"):
        io = RecordingIO()
        strategy = FSDPStrategy(
            state_dict_type=kind, cluster_environment=TorchElasticEnvironment(), checkpoint_io=io
        )
        layout = save_layout(strategy)
        # What Lightning's dump_checkpoint hands the strategy: a (here per-rank) state dict and
        # the optimizer states, beside the trainer's own keys.
        checkpoint = {
            "state_dict": {f"layer.{rank}.weight": torch.full((64,), float(rank))},
            "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.01, "params": []}]}],
            "global_step": 4,
            "epoch": 0,
        }
        path = out / kind / "step=4.ckpt"
        strategy.save_checkpoint(checkpoint, path)
        dist.barrier()  # Trainer.save_checkpoint's own barrier
        entry: dict[str, Any] = {"layout": layout, "io_wrote": io.written}
        if layout == "dcp":
            entry["files"] = rank_files(
                path,
                rank=rank,
                saves_shared=rank == 0,
                required=rank0_required(layout) if rank == 0 else (),
            )
        result[kind] = entry
    (out / f"result-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    target = Path(sys.argv[1])
    sys.exit(fork_ranks(2, lambda rank: run_rank(rank, target)))
