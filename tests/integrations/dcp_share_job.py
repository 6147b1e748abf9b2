"""A DCP checkpoint of 4 gloo ranks with sharded and replicated items, saved and loaded by
forked ranks (tests/integrations/ranks.py): what the node-share tests read and restore.

The tests call :func:`in_fresh_process`: the ranks fork from a new, single-threaded process
(``python -m tests.integrations.dcp_share_job``), never from the test's own. Forked from a pytest
worker that had already run torch's OpenMP pool or kept other threads alive (boto3's, tqdm's
monitor), the ranks hung in the load in CI (both cases at the 300 s timeout), by which tests ran
before on that worker.

The state: two DTensors sharded on dim 0 over every rank (``w`` of 1 MiB, so each shard is
larger than the restore's merge gap; ``b`` of 2 rows, so ranks 2 and 3 hold empty shards), an
HSDP tensor ``h`` (2 replicas × 2 shards: DCP stores each shard once, in one of its two holders'
files), a plain tensor and a scalar every rank holds (replicated: DCP keeps one copy, in the
least loaded rank's file), and a bytes item. Every rank builds the same full values from one
seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integrations.ranks import fork_ranks

WORLD = 4
ROOT = Path(__file__).resolve().parents[2]


def full_values() -> dict[str, Any]:
    """The state's full (unsharded) values, the same in every process."""
    import torch

    gen = torch.Generator().manual_seed(42)
    return {
        "w": torch.randn(1024, 256, generator=gen),
        "b": torch.randn(2, generator=gen),
        "h": torch.randn(512, 256, generator=gen),
        "rep": torch.randn(4096, generator=gen),
        "step": torch.tensor(7.0),
        "extra": {"lr": 0.25, "name": "node-share"},
    }


def _state(zero: bool) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (WORLD,))
    # HSDP's mesh: 2 replicas of 2 shards (ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1).
    hsdp = init_device_mesh("cpu", (2, WORLD // 2))
    values = full_values()
    if zero:
        values = {
            k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else {"lr": 0.0, "name": ""}
            for k, v in values.items()
        }
    return {
        "w": distribute_tensor(values["w"], mesh, [Shard(0)]),
        "b": distribute_tensor(values["b"], mesh, [Shard(0)]),
        "h": distribute_tensor(values["h"], hsdp, [Replicate(), Shard(0)]),
        "rep": values["rep"],
        "step": values["step"],
        "extra": values["extra"],
    }


def save(path: Path, *, lowest_rank: bool = False) -> int:
    """Save the state from ``WORLD`` forked ranks into ``path``; 0 on success."""

    def rank(_: int) -> int:
        import torch.distributed as dist
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        dist.init_process_group("gloo")
        planner = DefaultSavePlanner(dedup_save_to_lowest_rank=lowest_rank)
        dcp_save(_state(zero=False), checkpoint_id=str(path), planner=planner)
        dist.destroy_process_group()
        return 0

    return fork_ranks(WORLD, rank)


def load_and_compare(directory_of_rank: dict[int, Path]) -> int:
    """Every rank loads from its node's directory into zeros and compares with the saved values;
    0 when every rank's state equals what was saved."""

    def rank(r: int) -> int:
        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        dist.init_process_group("gloo")
        state = _state(zero=True)
        dcp_load(state, checkpoint_id=str(directory_of_rank[r]))
        full = full_values()
        ok = (
            torch.equal(state["w"].full_tensor(), full["w"])
            and torch.equal(state["b"].full_tensor(), full["b"])
            and torch.equal(state["h"].full_tensor(), full["h"])
            and torch.equal(state["rep"], full["rep"])
            and torch.equal(state["step"], full["step"])
            and state["extra"] == full["extra"]
        )
        dist.destroy_process_group()
        if not ok:
            print(f"rank {r} (pid {os.getpid()}): loaded state differs from the saved one")
        return 0 if ok else 1

    return fork_ranks(WORLD, rank)


def restore_as_nodes(payload: dict[str, Any]) -> int:
    """The restart's node part on ``WORLD`` forked ranks as nodes of ``payload["per_node"]``
    (torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``), as ``resume()`` runs it once rank 0
    decided: the header, the split table, the relay down the leaders' tree, each leader's share
    restored into its node's directory (``payload["dests"][node]``) from moto's S3
    (``payload["endpoint"]``).
    Each rank writes the S3 keys it GET and the bytes it fetched to ``payload["out"]``."""
    from trainer_client.restart.decide import Decision
    from trainer_client.restart.lookup import ResumePoint
    from trainer_client.storage.restore import RemoteObject

    objects = tuple(RemoteObject(**o) for o in payload["objects"])
    root = payload["root"]
    point = ResumePoint("job", 3, 0, 1, WORLD, dict.fromkeys(range(WORLD), root), root)

    def rank(r: int) -> int:
        import boto3
        import torch.distributed as dist

        from trainer_client.restart import relay
        from trainer_client.restart.node_fetch import (
            NodeFetch,
            fetch_for_node,
            read_metadata,
            this_node,
        )
        from trainer_client.restart.wire_table import share_header, share_table
        from trainer_client.storage.restore import restore

        per_node = payload["per_node"]
        os.environ.update({"LOCAL_RANK": str(r % per_node), "LOCAL_WORLD_SIZE": str(per_node)})
        dist.init_process_group("gloo")
        client = boto3.session.Session().client(
            "s3", endpoint_url=payload["endpoint"], region_name="us-east-1"
        )
        gets: list[str] = []
        client.meta.events.register(
            "before-parameter-build.s3.GetObject",
            lambda params, **_: gets.append(f"{params['Key']} {params.get('Range', '')}"),
        )
        node = this_node(dist)
        dest = Path(payload["dests"][r // per_node])
        read: list[NodeFetch] = []

        def read_items(chosen: Decision) -> Any:
            read.append(read_metadata(chosen.objects, dest, client=client, max_workers=4))
            return read[0].dcp

        held = share_header(dist, Decision(point, objects) if r == 0 else None, rank=r, node=node)
        decision = share_table(dist, held, rank=r, read_items=read_items)
        mine, relayed = relay.receive(
            dist, held, r, decision, read[0] if read else None, client=client, max_workers=4,
            chunk=payload.get("chunk", 2**20),
        )  # fmt: skip
        fetched = 0
        if held.restores:
            share = fetch_for_node(
                decision.objects, dest, node=node, saved_world_size=WORLD, client=client,
                max_workers=4, read=mine,
            )  # fmt: skip
            done = restore(
                share.share.objects, dest, client=client, max_workers=4,
                ranges=share.share.ranges, preloaded=share.preloaded, relayed=relayed.ranges,
            )  # fmt: skip
            fetched = done.fetched_bytes + share.fetched_bytes
        dist.barrier()
        dist.destroy_process_group()
        record = {"gets": gets, "fetched": fetched, "relayed": relayed.bytes}
        (Path(payload["out"]) / f"rank-{r}.json").write_text(json.dumps(record))
        return 0

    return fork_ranks(WORLD, rank)


def in_fresh_process(what: str, payload: dict[str, Any], *, timeout_s: float = 240.0) -> int:
    """``save`` (payload: path, lowest), ``load`` (payload: rank → directory) or ``restore``
    (:func:`restore_as_nodes`) in a new process;
    its exit status (0: every rank succeeded)."""
    command = [sys.executable, "-m", "tests.integrations.dcp_share_job", what, json.dumps(payload)]
    return subprocess.run(command, cwd=ROOT, timeout=timeout_s, check=False).returncode


def main(argv: list[str]) -> int:
    what, payload = argv[0], json.loads(argv[1])
    if what == "save":
        return save(Path(payload["path"]), lowest_rank=bool(payload["lowest"]))
    if what == "load":
        return load_and_compare({int(r): Path(d) for r, d in payload.items()})
    if what == "restore":
        return restore_as_nodes(payload)
    raise SystemExit(f"dcp_share_job: unknown action {what!r} (save, load or restore)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
