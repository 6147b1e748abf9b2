"""Four gloo ranks as two nodes of two (torchrun's LOCAL_RANK/LOCAL_WORLD_SIZE) receive an HF
``Trainer`` checkpoint's decision through ``share_header`` and ``share_table``
(trainer_client/restart/wire_table.py), once at the saved world size and once as if saved by
8 ranks; each rank writes what it holds.

Run by the test in a fresh process (``python -m tests.integrations.wire_table_job OUT``): the
ranks fork from it, never from the pytest worker (see dcp_share_job.py).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from tests.integrations.ranks import fork_ranks
from trainer_client.restart.decide import Decision
from trainer_client.restart.lookup import ResumePoint
from trainer_client.storage.restore import RemoteObject

WORLD = 4
ROOT = "s3://b/job/checkpoint-8"
NAMES = ["model.safetensors", "trainer_state.json", *(f"rng_state_{r}.pth" for r in range(WORLD))]


def decision(saved_world_size: int) -> Decision:
    """The decision rank 0 shares (the same on every rank, for the test to compare)."""
    objects = tuple(
        RemoteObject(f"{ROOT}/{n}", n, 10 + i, f"{i:064x}", "v", '"e"') for i, n in enumerate(NAMES)
    )
    uris = {r: ROOT for r in range(saved_world_size)}
    return Decision(ResumePoint("job", 8, 0, 1, saved_world_size, uris, ROOT), objects, "/out")


def main(out: Path) -> int:
    def rank(r: int) -> int:
        import torch.distributed as dist

        from trainer_client.restart.node_fetch import this_node
        from trainer_client.restart.wire_table import share_header, share_table

        os.environ.update({"LOCAL_RANK": str(r % 2), "LOCAL_WORLD_SIZE": "2"})
        dist.init_process_group("gloo")
        node = this_node(dist)
        held = {}
        for saved in (WORLD, 2 * WORLD):
            got = share_header(dist, decision(saved) if r == 0 else None, rank=r, node=node)
            assert replace(got.decision, objects=()) == replace(decision(saved), objects=())
            mine = share_table(dist, got, rank=r, read_items=lambda _: {})
            rows = [o.relative for o in mine.objects]
            assert set(mine.objects) <= set(decision(saved).objects)
            held[saved] = {"rows": rows, "objects": got.objects, "restores": got.restores}
        dist.destroy_process_group()
        (out / f"rank-{r}.json").write_text(json.dumps(held))
        return 0

    return fork_ranks(WORLD, rank)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
