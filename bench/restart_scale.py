"""The restart at scale: what each node fetches of a DCP and a Hugging Face Trainer checkpoint,
and a model of a 100,000-rank restart against S3's request rates.

``--nodes`` simulated nodes × ``--ranks-per-node`` ranks on this machine, S3 on moto's server.
Checkpoints (pinned as reports pin them: size, SHA-256, VersionId):

* **dcp**: saved by ``nodes × ranks`` gloo processes with ``dcp.save``: DTensors sharded on dim 0
  (``--dcp-mb`` in all) and replicated items (a tensor, a step scalar per sharded tensor, a bytes
  item), DCP's default dedup (``--lowest-rank``: ``dedup_save_to_lowest_rank``);
* **hf**: the files a ``Trainer`` writes (model, optimizer, scheduler, state, ``rng_state_<r>``
  per rank; ``--hf-mb`` in all), and **deepspeed**: ``global_stepN/`` with each rank's ZeRO
  partition and the common model states (layouts by name: no framework runs).

Each node, in turn, with its own directory, its own S3 client and its ranks
(``NodeRanks``), does what the restart does on it: ``fetch_for_node`` (``.metadata`` first, then
the share: "share s" is that time) and ``restore``. Printed: each node's fetched bytes and
requests, the total ÷ the checkpoint's bytes against the bound 1.05 × (checkpoint + replicated ×
(nodes − 1)), and the requests per key prefix. Then the model (:func:`model`).

Run: ``python -m bench restart_scale [--nodes 4] [--ranks-per-node 2] [--dcp-mb 32] [--hf-mb 32]
[--lowest-rank] [--model-gbps 25] [--model-part-mb 8]``.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing
import os
import pickle
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._harness import helpers_s3, load
from ckpt_pipeline.local.sqs_server import moto_sqs_server
from trainer_client.restart import relay
from trainer_client.restart.node_fetch import fetch_for_node
from trainer_client.restart.node_share import NodeRanks, stored_items
from trainer_client.restart.relay import RELAY_GET_WORKERS
from trainer_client.restart.wire_table import RELAY_CHUNK
from trainer_client.storage.restore import RemoteObject, restore
from trainer_client.storage.s3_pins import head_pin
from trainer_client.storage.uri import SPREAD_PREFIXES, spread_key
from trainer_client.storage.verify import LIST_PAGE
from trainer_client.storage.verify_listing import LIST_WORKERS

# S3: "at least 3,500 PUT/COPY/POST/DELETE or 5,500 GET/HEAD requests per second per partitioned
# Amazon S3 prefix"; "no limits to the number of prefixes in a bucket":
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html
S3_GET_PER_PREFIX = 5_500
S3_PUT_PER_PREFIX = 3_500


def _save_rank(rank: int, world: int, port: int, path: str, mb: float, lowest: bool) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    tensors = 8
    rows = max(world, int(mb * 1e6 / 4 / tensors / 256) // world * world)
    gen = torch.Generator().manual_seed(0)
    state: dict[str, Any] = {
        f"layer{i}.weight": distribute_tensor(
            torch.randn(rows, 256, generator=gen), mesh, [Shard(0)]
        )
        for i in range(tensors)
    }
    state |= {f"optim.step.layer{i}": torch.tensor(float(i)) for i in range(tensors)}
    state |= {
        "replicated.buffer": torch.randn(16_384, generator=gen),
        "param_groups": [{"lr": 1e-3}],
    }
    planner = DefaultSavePlanner(dedup_save_to_lowest_rank=lowest)
    dcp_save(state, checkpoint_id=path, planner=planner)
    dist.destroy_process_group()


def save_dcp(path: Path, world: int, mb: float, lowest: bool) -> None:
    """A real DCP save by ``world`` gloo processes (forked: torch imported once)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_save_rank, args=(r, world, port, str(path), mb, lowest))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"dcp.save failed: exit codes {[p.exitcode for p in procs]}")


def write_hf(path: Path, world: int, mb: float, deepspeed: bool) -> None:
    """The files of a Trainer's ``checkpoint-N`` (DDP) or its DeepSpeed ZeRO save, random bytes."""
    model = int(mb * 1e6 / 3)
    if deepspeed:
        files = {"global_step8/mp_rank_00_model_states.pt": model, "latest": 13}
        files |= {
            f"global_step8/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt": 2 * model // world
            for r in range(world)
        }
    else:
        files = {"model.safetensors": model, "optimizer.pt": 2 * model}
        files |= {f"rng_state_{r}.pth": 14_000 for r in range(world)}
    files |= {"trainer_state.json": 2_000, "training_args.bin": 5_000, "scheduler.pt": 1_000}
    for name, size in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(os.urandom(size))


def upload(client: Any, bucket: str, prefix: str, local: Path) -> list[RemoteObject]:
    """Every file under ``local`` to ``prefix``, pinned from its HEAD with its SHA-256."""
    objects = []
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        relative = f.relative_to(local).as_posix()
        data = f.read_bytes()
        client.put_object(Bucket=bucket, Key=f"{prefix}/{relative}", Body=data)
        pin = head_pin(
            client, f"s3://{bucket}/{prefix}/{relative}", sha256=hashlib.sha256(data).hexdigest()
        )
        objects.append(
            RemoteObject(pin.uri, relative, len(data), pin.sha256, pin.version_id, pin.etag)
        )
    return objects


def _replicated(objects: Sequence[RemoteObject], local: Path) -> int:
    """The bytes every node needs: files no rank's name marks, and DCP's replicated items."""
    total = 0
    for obj in objects:
        name = obj.relative.rsplit("/", 1)[-1]
        if name.endswith(".distcp"):
            continue
        if not any(m in name for m in ("rng_state_", "zero_pp_rank_")):
            total += obj.bytes
    metadata = local / ".metadata"
    if metadata.is_file():
        items = stored_items(pickle.loads(metadata.read_bytes()))
        total += sum(i.length for i in items if not i.sharded)
    return total


def run_nodes(layout: str, endpoint: str, objects: list[RemoteObject], local: Path,
              nodes: int, per_node: int, scratch: Path, relayed: bool = True) -> bool:  # fmt: skip
    """Every node's share restored into its own directory; prints the table, True if in bound.
    ``relayed``: node 0 (rank 0's) reads ``.metadata`` and the replicated ranges and the others
    take them from its relay (:mod:`trainer_client.restart.relay`), as the restart does; else
    every node reads them from S3."""
    world = nodes * per_node
    total = sum(o.bytes for o in objects)
    requests: Counter[str] = Counter()
    hot: Counter[str] = Counter()
    handed = relay.Relay()
    print(
        f"\n## {layout}: {len(objects)} objects, {total / 1e6:.1f} MB, {nodes} × {per_node} "
        f"ranks, {'relay from node 0' if relayed else 'every node reads S3'}"
    )
    print("| node | ranks | objects (in part) | fetched (MB) | GETs | share s | restore s |")
    print("|---|---|---|---|---|---|---|")
    fetched_all = 0
    for n in range(nodes):
        client = helpers_s3(endpoint, 16)
        gets: Counter[str] = Counter()

        def count(params: dict[str, Any], gets: Counter[str] = gets, **_: Any) -> None:
            key = params.get("Key", params.get("Prefix", ""))
            gets[key.rsplit("/", 1)[0]] += 1
            hot[key.rsplit("/", 1)[-1]] += 1

        client.meta.events.register("before-parameter-build.s3.GetObject", count)
        node = NodeRanks(range(n * per_node, (n + 1) * per_node), world)
        dest = scratch / layout / f"node-{n}" / "checkpoint"
        started = time.perf_counter()
        read = relay.read_from(handed, objects) if n and relayed else None
        mine = fetch_for_node(
            objects, dest, node=node, saved_world_size=world, client=client, max_workers=16,
            read=read,
        )  # fmt: skip
        if n == 0 and relayed:
            handed = relay.gather(objects, mine, client=client, max_workers=16)
        decided = time.perf_counter() - started
        done = restore(
            mine.share.objects,
            dest,
            client=client,
            ranges=mine.share.ranges,
            preloaded=mine.preloaded,
            relayed=handed.ranges if n else None,
        )
        restored = time.perf_counter() - started - decided
        fetched = done.fetched_bytes + mine.fetched_bytes
        fetched_all += fetched
        requests.update(gets)
        print(
            f"| {n} | {node.ranks.start}–{node.ranks.stop - 1} | {len(mine.share.objects)} "
            f"({len(mine.share.ranges)}) | {fetched / 1e6:.2f} | {sum(gets.values())} "
            f"| {decided:.2f} | {restored:.2f} |"
        )
    replicated = _replicated(objects, local)
    bound = 1.05 * (total + replicated * (nodes - 1))
    ok = fetched_all <= bound
    print(
        f"total fetched ÷ checkpoint: {fetched_all / total:.2f} (bound 1.05 × (checkpoint + "
        f"{replicated / 1e6:.2f} MB replicated × {nodes - 1}) = {bound / total:.2f}; every node "
        f"everything: {nodes:.2f}) {'PASS' if ok else 'FAIL'}"
    )
    print("GETs per prefix: " + ", ".join(f"{p}: {c}" for p, c in sorted(requests.items())))
    if metadata := hot.get(".metadata"):
        busiest, most = max(
            ((k, c) for k, c in hot.items() if k.endswith(".distcp")), key=lambda kc: kc[1]
        )
        print(
            f"GETs of .metadata: {metadata}; of the busiest .distcp ({busiest}): {most}; "
            f"relay {handed.bytes / 1e3:.1f} kB to each leader"
        )
    return ok


def model(
    ranks: int = 100_000,
    per_node: int = 8,
    checkpoint_tb: float = 10.0,
    node_gbps: float = 25.0,
    part_mb: float = 8.0,
    replicated_files: int = 1,
    metadata_mb: float = 13.2,
) -> list[str]:
    """A restart of a fully sharded checkpoint (one file per rank, equal sizes) where each node
    fetches its ranks' files, and rank 0 alone fetches what every node reads (``.metadata``,
    ``replicated_files`` ranged GETs for items stored elsewhere: 1 with
    ``dedup_save_to_lowest_rank``, with DCP's balanced dedup up to one per replicated item, each
    in another rank's file) and relays it down the leaders' tree
    (:mod:`trainer_client.restart.relay`). ``metadata_mb``: ``.metadata``'s size at ``ranks``
    (:func:`decision_model` measures it: 13.2 MB at 100,000)."""
    nodes = ranks // per_node
    per_rank = checkpoint_tb * 1e12 / ranks
    part = part_mb * 2**20
    per_node_bytes = per_node * per_rank
    node_gets = per_node * math.ceil(per_rank / part)
    gets = nodes * node_gets + replicated_files + 1
    link = node_gbps * 1e9 / 8
    transfer_s = per_node_bytes / link
    one_prefix_s = gets / S3_GET_PER_PREFIX
    # The done-criterion: the restore within 1.2 × the transfer time.
    prefixes = math.ceil(gets / (S3_GET_PER_PREFIX * 1.2 * transfer_s))
    save_puts = ranks * math.ceil(per_rank / part)
    spread = next((n for n in SPREAD_PREFIXES if n >= prefixes), SPREAD_PREFIXES[-1])
    busiest, hot = _busiest_prefix(ranks, math.ceil(per_rank / part), replicated_files, spread)
    busiest_s = busiest / S3_GET_PER_PREFIX
    # The relay: .metadata and the replicated ranges (assumed 16 KiB each: a step, a buffer), in
    # 1 MiB chunks down a binary tree; a leader's link receives a chunk and sends two per chunk.
    relay_bytes = metadata_mb * 1e6 + replicated_files * 16 * 2**10
    depth = math.ceil(math.log2(nodes + 1)) - 1
    chunk_s = min(RELAY_CHUNK, relay_bytes) / link
    tree_s = (3 * depth + 2 * math.ceil(relay_bytes / RELAY_CHUNK)) * chunk_s + depth * 20e-6
    # Rank 0's ranged GETs of the replicated items, RELAY_GET_WORKERS at once, 0.2 s each (S3's
    # first-byte latency, 100-200 ms: optimizing-performance.html).
    gather_s = math.ceil(replicated_files / RELAY_GET_WORKERS) * 0.2
    within = max(transfer_s, busiest_s) <= 1.2 * transfer_s
    return [
        f"model: {ranks:,} ranks = {nodes:,} nodes × {per_node}, {checkpoint_tb:g} TB sharded "
        f"({per_rank / 1e6:.0f} MB per rank), {node_gbps:g} Gbit/s per node, {part_mb:g} MiB GETs",
        f"  per node: {per_node_bytes / 1e9:.2f} GB in {node_gets} GETs of its ranks' files; "
        f"at {node_gbps:g} Gbit/s: {transfer_s:.2f} s",
        f"  all nodes: {gets:,} GETs ({replicated_files + 1} of them rank 0's: .metadata and "
        f"{replicated_files} replicated range(s), relayed); one partitioned prefix "
        f"({S3_GET_PER_PREFIX:,} GET/s) serves them in {one_prefix_s:,.0f} s = "
        f"{one_prefix_s / transfer_s:,.0f}× the transfer time",
        f"  partitioned prefixes for the GETs to fit in 1.2 × the transfer: {prefixes:,}",
        f"  spread_prefixes={spread:,} (keys as saved, each behind its hash): busiest prefix "
        f"{busiest:,} GETs = {busiest_s:.2f} s (mean {gets / spread:,.0f} = "
        f"{gets / spread / S3_GET_PER_PREFIX:.2f} s), of them {hot:,} on keys every node reads: "
        f"the transfer {'within' if within else 'NOT within'} 1.2 × {transfer_s:.2f} s",
        f"  before it, the relay: rank 0's {replicated_files:,} ranged GET(s), "
        f"{RELAY_GET_WORKERS} at once: {gather_s:.1f} s; {relay_bytes / 1e6:.1f} MB down "
        f"{depth} hops in 1 MiB chunks: {tree_s:.3f} s (without it, every node GETs those keys: "
        f"{nodes:,} GETs on each, {nodes / S3_GET_PER_PREFIX:.2f} s a key)",
        f"  the save's PUTs (parts): {save_puts:,}; one prefix ({S3_PUT_PER_PREFIX:,} PUT/s): "
        f"{save_puts / S3_PUT_PER_PREFIX:,.0f} s",
    ]


def _busiest_prefix(ranks: int, own: int, replicated: int, spread: int) -> tuple[int, int]:
    """GETs on the busiest spread prefix of a DCP restart (``spread_key`` of each file: the
    upload's own layout), and how many of them are on keys every node reads (``.metadata``, the
    files holding replicated items: one GET each, rank 0's, which relays them)."""
    per_prefix: Counter[str] = Counter()
    hot: Counter[str] = Counter()
    for rank in range(ranks):
        where = spread_key(f"job/step-1000/__{rank}_0.distcp", spread).split("/", 1)[0]
        per_prefix[where] += own
        if rank < replicated:  # one ranged GET, rank 0's
            per_prefix[where] += 1
            hot[where] += 1
    metadata = spread_key("job/step-1000/.metadata", spread).split("/", 1)[0]
    per_prefix[metadata] += 1
    hot[metadata] += 1
    busiest, gets = per_prefix.most_common(1)[0]
    return gets, hot[busiest]


def decision_model(ranks: int = 100_000, per_node: int = 8, replicated: int = 1_000) -> list[str]:
    """The decision's time at ``ranks``, each term from a measured cost: the database's and the
    listing's from BENCHMARKS §10, S3's latency from its page, the split of the table (rank 0's
    ``.metadata`` read, ``node_rows``, the encoding) timed here on a ``.metadata`` of one tensor
    sharded over every rank and ``replicated`` replicated items spread over as many files."""
    import torch
    from torch.distributed.checkpoint import metadata as m
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    from trainer_client.restart.lookup import ResumePoint
    from trainer_client.restart.node_share import node_rows
    from trainer_client.restart.wire_decision import rows_to_bytes

    files = [f"__{r}_0.distcp" for r in range(ranks)]
    chunks = [m.ChunkStorageMetadata(torch.Size([4 * r]), torch.Size([4])) for r in range(ranks)]
    state: dict[str, Any] = {
        "w": m.TensorStorageMetadata(m.TensorProperties(), torch.Size([4 * ranks]), chunks)
    }
    storage = {m.MetadataIndex("w", (4 * r,)): _StorageInfo(files[r], 0, 16) for r in range(ranks)}
    for i in range(replicated):
        state[f"s{i}"] = m.BytesStorageMetadata()
        storage[m.MetadataIndex(f"s{i}")] = _StorageInfo(files[i * ranks // replicated], 16, 8)
    data = pickle.dumps(m.Metadata(state, storage_data=storage))

    def pinned(f: str) -> RemoteObject:  # random-looking pins, as zlib meets real ones
        sha, version = (hashlib.sha256(f"{f}{x}".encode()).hexdigest() for x in "sv")
        return RemoteObject(f"s3://b/c/{f}", f, 10**8, sha, version[:32], f'"{sha[:32]}"')

    objects = [pinned(f) for f in [".metadata", *files]]
    point = ResumePoint("job", 1, 0, 1, ranks, {}, "s3://b/c")
    started = time.process_time()  # CPU seconds: less moved by the other load than wall time
    items = stored_items(pickle.loads(data))
    read_s = time.process_time() - started
    rows = node_rows(objects, per_node=per_node, world_size=ranks, dcp={"": items})
    rows_s = time.process_time() - started - read_s
    common = rows_to_bytes(point, [objects[i] for i in rows.common])
    tables = [rows_to_bytes(point, [objects[i] for i in own]) for own in rows.own]
    encode_s = time.process_time() - started - read_s - rows_s
    table = len(common) + max(len(t) for t in tables)
    # BENCHMARKS §10: the lookup (decision + pins) from the manifest at 100,000 ranks, 16.4 ms;
    # the listing's client CPU 0.031-0.048 ms a key with timestamps as text; pages of 1,000 keys,
    # LIST_WORKERS (8) at once; S3's first-byte latency 100-200 ms (optimizing-performance.html).
    pages = math.ceil((ranks + 1) / LIST_PAGE)
    listing_s = pages / LIST_WORKERS * 0.2 + (ranks + 1) * 0.048e-3
    # Collectives: ~30 tree collectives of <= 1 KB (~17 hops), one send per node: 20 us each.
    wire_s = (30 * math.ceil(math.log2(ranks)) + ranks // per_node) * 20e-6
    # The split follows the header (wire_table.py): on the leaders' restore path, not the decision.
    total = 0.0164 + listing_s + wire_s
    return [
        f"decision model at {ranks:,} ranks ({ranks // per_node:,} nodes × {per_node}), "
        f"load {load()}:",
        "  database (rows of the candidate, from the manifest; measured, §10): 0.016 s",
        f"  verification by listing: {pages} pages, {LIST_WORKERS} at once, 0.2 s each + "
        f"0.048 ms a key of client CPU: {listing_s:.1f} s (by HEAD, where listing is refused: "
        f"{(ranks + 1) * 1.3e-3 + (ranks + 1) / 64 * 0.2:,.0f} s)",
        f"  then, before the leaders' restores, rank 0 reads .metadata ({len(data) / 1e6:.1f} MB; "
        f"{len(items):,} items) "
        f"{read_s:.2f} s, node_rows {rows_s:.2f} s, encodes {len(tables):,} tables "
        f"{encode_s:.2f} s (CPU measured here; common rows {len(rows.common):,}); each leader "
        f"then reads the relayed .metadata likewise ({read_s:.2f} s) before its fetch",
        f"  collectives (20 us a hop or send, assumed): {wire_s:.2f} s; a node's first rank "
        f"receives {table / 1e3:.1f} kB, rank 0 sends {table * len(tables) / 1e6:.0f} MB",
        f"  decision {total:.1f} s against the 10 s bound: {'within' if total <= 10 else 'OVER'}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench restart_scale", description=__doc__)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--dcp-mb", type=float, default=32.0)
    parser.add_argument("--hf-mb", type=float, default=32.0)
    parser.add_argument("--lowest-rank", action="store_true")
    parser.add_argument("--layouts", nargs="*", default=["dcp", "hf", "deepspeed"],
                        choices=["dcp", "hf", "deepspeed"])  # fmt: skip
    parser.add_argument("--model-gbps", type=float, default=25.0)
    parser.add_argument("--model-part-mb", type=float, default=8.0)
    args = parser.parse_args(argv)
    if args.nodes < 2 or args.ranks_per_node < 1:
        parser.error("--nodes must be >= 2 and --ranks-per-node >= 1")
    world = args.nodes * args.ranks_per_node
    print(f"# restart_scale: {args.nodes} × {args.ranks_per_node} ranks, S3 on moto, load {load()}")
    import torch.distributed.checkpoint  # noqa: F401  (imported in a training process: not timed)

    ok = True
    with moto_sqs_server() as endpoint, tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        client = helpers_s3(endpoint, 16)
        bucket = f"scale-{uuid.uuid4().hex[:8]}"
        client.create_bucket(Bucket=bucket)
        client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        for layout in args.layouts:
            local = Path(scratch) / "saved" / layout
            local.mkdir(parents=True)
            if layout == "dcp":
                save_dcp(local, world, args.dcp_mb, args.lowest_rank)
            else:
                write_hf(local, world, args.hf_mb, deepspeed=layout == "deepspeed")
            objects = upload(client, bucket, f"job/{layout}/checkpoint-8", local)
            for relayed in (True, False) if layout == "dcp" else (True,):
                ok &= run_nodes(
                    layout, endpoint, objects, local, args.nodes, args.ranks_per_node,
                    Path(scratch) / str(relayed), relayed,
                )  # fmt: skip
    print()
    for part_mb, replicated in ((args.model_part_mb, 1), (args.model_part_mb, 1_000), (64.0, 1)):
        print(
            "\n".join(
                model(
                    node_gbps=args.model_gbps,
                    part_mb=part_mb,
                    replicated_files=replicated,
                )
            )
        )
    print("\n".join(decision_model()))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
