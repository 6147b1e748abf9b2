"""Which objects a node restores (trainer_client/restart/node_share.py, node_fetch.py):
read from real ``.metadata`` files that 4 gloo ranks' ``dcp.save`` wrote, and a 2-node × 2-rank
DCP restart from S3 (moto) where each node's directory holds only its share and every rank's
``dcp.load`` from its node's directory gives the saved state."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from tests.integrations import dcp_share_job
from trainer_client.restart import relay
from trainer_client.restart.node_fetch import fetch_for_node, metadata_dir
from trainer_client.restart.node_share import (
    NodeRanks,
    StoredItem,
    dcp_reads,
    node_rows,
    node_share,
    stored_items,
)
from trainer_client.storage.restore import MANIFEST, RemoteObject, restore
from trainer_client.storage.restore_fetch import held
from trainer_client.storage.s3_pins import head_pin
from trainer_client.storage.uri import spread_key

pytest.importorskip("torch")
WORLD = dcp_share_job.WORLD
REPLICATED = {"rep", "step", "extra.lr", "extra.name"}


@pytest.fixture(scope="module", params=["balanced", "lowest"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DCP directory saved by 4 ranks: DCP's default dedup, and dedup_save_to_lowest_rank."""
    path = tmp_path_factory.mktemp("dcp") / "step-3"
    payload = {"path": str(path), "lowest": request.param == "lowest"}
    assert dcp_share_job.in_fresh_process("save", payload) == 0
    return path


def _items(path: Path) -> list[StoredItem]:
    return stored_items(pickle.loads((path / ".metadata").read_bytes()))


def _objects(path: Path, root: str = "s3://b/job/step-3") -> list[RemoteObject]:
    return [
        RemoteObject(f"{root}/{f.name}", f.name, f.stat().st_size, None)
        for f in sorted(path.iterdir())
    ]


def _inside(item: StoredItem, ranges: tuple[tuple[int, int], ...] | None) -> bool:
    return ranges is None or any(
        o <= item.offset and item.offset + item.length <= o + n for o, n in ranges
    )


def test_a_node_reads_its_ranks_files_whole_and_only_replicated_items_of_the_others(
    saved: Path,
) -> None:
    # GIVEN a real .metadata: DCP stored each replicated item once, in some rank's file
    items = _items(saved)
    assert {i.fqn for i in items if not i.sharded} == REPLICATED
    for node in (range(0, 2), range(2, 4)):
        # WHEN the node of ranks 0-1 (then 2-3) asks what its ranks read
        reads = dcp_reads(items, node)
        # THEN its own ranks' files whole; of the others, the replicated items and nothing of
        # another rank's shard of ``w``
        for r in node:
            assert reads[f"__{r}_0.distcp"] is None
        for item in items:
            if item.fqn in REPLICATED or int(item.file[2]) in node:
                assert item.file in reads and _inside(item, reads[item.file]), item
            elif item.fqn == "w":
                assert item.file not in reads or not _inside(item, reads[item.file]), item
        # ``b``: ranks 2 and 3 hold empty shards, stored once: a node of such ranks takes
        # every chunk of ``b`` (they may read any)
        for item in items:
            if item.fqn == "b" and 2 in node:
                assert _inside(item, reads.get(item.file, ())), item


def test_a_rank_that_stored_no_chunk_of_an_hsdp_tensor_reads_its_replicas_chunk(
    saved: Path,
) -> None:
    # GIVEN HSDP's ``h``: ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1, each stored once
    items = _items(saved)
    chunks = sorted((i.chunk, i.file) for i in items if i.fqn == "h")
    assert [c for c, _ in chunks] == [(0, 0), (256, 0)]
    for rank in range(WORLD):
        # WHEN a node of one rank asks what it reads
        reads = dcp_reads(items, range(rank, rank + 1))
        # THEN its own shard (rank mod 2), wherever stored, and not the other shard
        for position, (_, file) in enumerate(chunks):
            item = next(i for i in items if i.fqn == "h" and i.file == file)
            held = file in reads and _inside(item, reads[file])
            assert held == (position == rank % 2 or file == f"__{rank}_0.distcp"), (rank, file)


def test_every_nodes_share_is_within_the_bound(saved: Path) -> None:
    objects = _objects(saved)
    total = sum(o.bytes for o in objects)
    items = _items(saved)
    # The replicated bytes every node also needs: .metadata and the replicated items.
    replicated = (saved / ".metadata").stat().st_size + sum(
        i.length for i in items if not i.sharded
    )
    hsdp_shard = max(i.length for i in items if i.fqn == "h")
    for per_node in (1, 2):
        # HSDP's ``h`` is replicated too: a node needs its ranks' shards of it (at most 2)
        replicated_here = replicated + min(per_node, 2) * hsdp_shard
        nodes = [NodeRanks(range(n, n + per_node), WORLD) for n in range(0, WORLD, per_node)]
        shares = [
            node_share(objects, node=node, saved_world_size=WORLD, dcp={"": items})
            for node in nodes
        ]
        fetched = sum(s.bytes for s in shares)
        print(f"{len(nodes)} nodes: {fetched} B of {total} B ({fetched / total:.2f}x)")
        # ``b``'s every chunk to nodes with an empty shard: a few hundred bytes beyond
        bound = 1.05 * (total + replicated_here * (len(nodes) - 1))
        assert fetched <= bound, (fetched, bound)


def test_hf_trainer_and_deepspeed_files_by_name() -> None:
    names = [
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "trainer_state.json",
        "training_args.bin",
        *(f"rng_state_{r}.pth" for r in range(WORLD)),
        "latest",
        "zero_to_fp32.py",
        "global_step8/mp_rank_00_model_states.pt",
        *(f"global_step8/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(WORLD)),
    ]
    objects = [RemoteObject(f"s3://b/c/{n}", n, 10, None) for n in names]
    share = node_share(objects, node=NodeRanks(range(2, 4), WORLD), saved_world_size=WORLD, dcp={})
    mine = sorted(o.relative for o in share.objects)
    assert "rng_state_2.pth" in mine and "rng_state_3.pth" in mine
    assert "rng_state_0.pth" not in mine and "rng_state_1.pth" not in mine
    assert "global_step8/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt" in mine
    assert "global_step8/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt" not in mine
    for common in ("model.safetensors", "optimizer.pt", "latest", "trainer_state.json"):
        assert common in mine
    assert "global_step8/mp_rank_00_model_states.pt" in mine
    assert len(mine) == len(names) - 4 and not share.ranges


def test_a_changed_world_size_or_unknown_placement_fetches_everything(saved: Path) -> None:
    objects = _objects(saved)
    items = _items(saved)
    shrunk = node_share(
        objects, node=NodeRanks(range(0, 1), 2), saved_world_size=WORLD, dcp={"": items}
    )
    assert shrunk.objects == tuple(objects) and not shrunk.ranges
    assert shrunk.whole_because == "saved by 4 ranks, resumed by 2"
    # A DCP directory whose .metadata was not read: every file of it
    unread = node_share(objects, node=NodeRanks(range(0, 2), WORLD), saved_world_size=WORLD, dcp={})
    assert unread.objects == tuple(objects) and not unread.ranges


@pytest.mark.parametrize(
    ("rank", "local", "count", "expected"),
    [
        (5, "1", "4", range(4, 8)),  # torchrun: node 1 of 4 ranks each
        (5, None, None, range(0, 8)),  # not torchrun: the whole job
        (5, "1", "x", range(0, 8)),
        (7, "3", "8", range(0, 8)),  # does not fit the world: the whole job
    ],
)
def test_node_ranks_from_torchruns_variables(
    rank: int, local: str | None, count: str | None, expected: range
) -> None:
    node = NodeRanks.of(rank=rank, world_size=8, local_rank=local, local_world_size=count)
    assert node.ranks == expected


def _upload(s3: Any, bucket: str, path: Path, spread: int = 0) -> list[RemoteObject]:
    objects = []
    for f in sorted(path.iterdir()):
        key = spread_key(f"job/{path.name}/{f.name}", spread)
        data = f.read_bytes()
        s3.put_object(Bucket=bucket, Key=key, Body=data)
        pin = head_pin(s3, f"s3://{bucket}/{key}", sha256=hashlib.sha256(data).hexdigest())
        objects.append(
            RemoteObject(pin.uri, f.name, len(data), pin.sha256, pin.version_id, pin.etag)
        )
    return objects


@pytest.mark.slow
@pytest.mark.parametrize("spread", [0, 16])
def test_two_nodes_of_two_ranks_restore_their_share_and_load_the_saved_state(
    saved: Path,
    s3: Any,
    versioned_bucket: str,
    tmp_path: Path,
    spread: int,
    request: pytest.FixtureRequest,
) -> None:
    if spread and request.node.callspec.params["saved"] == "lowest":
        pytest.skip("the spread does not depend on the dedup mode: one run of it is enough")
    # GIVEN the 4-rank checkpoint in S3, every object pinned (size, SHA-256, VersionId); with
    # ``spread`` each at its spread key (UploadSettings.spread_prefixes): the names DCP's
    # .metadata gives stay the relative names, so the restored directory is the same
    objects = _upload(s3, versioned_bucket, saved, spread)
    assert spread == 0 or all(o.uri.split("/")[3] != "job" for o in objects)
    total = sum(o.bytes for o in objects)
    dirs: dict[int, Path] = {}
    fetched = []
    for first in (0, 2):
        # WHEN each node (its own directory, ranks first..first+1) restores its share, twice
        # (the node's second rank finds the copy)
        dest = tmp_path / f"node-{first // 2}" / saved.name
        node = NodeRanks(range(first, first + 2), WORLD)
        sources = []
        for _ in range(2):
            mine = fetch_for_node(
                objects, dest, node=node, saved_world_size=WORLD, client=s3, max_workers=4
            )
            done = restore(
                mine.share.objects,
                dest,
                client=s3,
                max_workers=4,
                ranges=mine.share.ranges,
                preloaded=mine.preloaded,
            )
            sources.append(done.source)
            fetched.append(done.fetched_bytes + mine.fetched_bytes)
        assert sources == ["store", "manifest"]
        assert not metadata_dir(dest).exists() or (metadata_dir(dest) / ".metadata").is_file()
        # THEN its own ranks' files are whole and verified, the other ranks' files hold only
        # the ranges of the items its ranks read (zeros elsewhere: sparse), or are absent
        for obj in objects:
            if obj not in mine.share.objects:
                assert not (dest / obj.relative).exists()  # none of its items is read here
                continue
            local = (dest / obj.relative).read_bytes()
            remote = s3.get_object(Bucket=versioned_bucket, Key=obj.uri.split("/", 3)[3])
            original = remote["Body"].read()
            if obj.relative in mine.share.ranges:
                assert local != original
                for offset, length in mine.share.ranges[obj.relative]:
                    assert local[offset : offset + length] == original[offset : offset + length]
            else:
                assert local == original, obj.relative
        assert (dest / MANIFEST).is_file()
        for r in (first, first + 1):
            dirs[r] = dest
    # The second call fetched nothing; the first fetched the node's share only
    assert fetched[1] == fetched[3] == 0
    assert fetched[0] < total and fetched[2] < total
    print(f"fetched per node: {fetched[0]} B, {fetched[2]} B of a {total} B checkpoint")
    # AND every rank's dcp.load from its node's directory gives the saved state
    assert dcp_share_job.in_fresh_process("load", {str(r): str(d) for r, d in dirs.items()}) == 0


def test_each_nodes_table_holds_every_file_its_share_names(saved: Path) -> None:
    # GIVEN the real .metadata (replicated items spread over ranks' files, HSDP's ``h``)
    objects = _objects(saved)
    items = _items(saved)
    for per_node in (1, 2):
        # WHEN rank 0 splits the table by node (wire_table.py)
        rows = node_rows(objects, per_node=per_node, world_size=WORLD, dcp={"": items})
        for node, own in enumerate(rows.own):
            table = sorted(rows.common + own)  # a leader receives them in another order
            ranks = NodeRanks(range(node * per_node, (node + 1) * per_node), WORLD)
            # THEN the node's share from its table is its share from the whole table
            mine = [objects[i] for i in table]
            whole = node_share(objects, node=ranks, saved_world_size=WORLD, dcp={"": items})
            assert node_share(mine, node=ranks, saved_world_size=WORLD, dcp={"": items}) == whole
            # AND beyond those files, only files of ``b`` (its chunks follow no mesh: every rank
            # but its storers may read any, and the table leaves out no storer's file)
            extra = {o.relative for o in mine} - {o.relative for o in whole.objects}
            assert all(any(i.file == n and i.uneven for i in items) for n in extra), extra


@pytest.mark.slow
@pytest.mark.parametrize("per_node", [2, 1])
def test_keys_every_node_reads_are_fetched_once_and_relayed_down_the_leaders(
    saved: Path,
    s3: Any,
    versioned_bucket: str,
    moto_endpoint: str,
    tmp_path: Path,
    per_node: int,
    request: pytest.FixtureRequest,
) -> None:
    if per_node == 1 and request.node.callspec.params["saved"] == "lowest":
        pytest.skip("the tree's depth does not depend on the dedup mode: one run of it is enough")
    # GIVEN the 4-rank checkpoint in S3, pinned, and 4 gloo ranks as nodes of ``per_node``
    # (4 nodes of 1: a tree of leaders 0 -> 1, 2 and 1 -> 3)
    objects = _upload(s3, versioned_bucket, saved)
    items = _items(saved)
    nodes = WORLD // per_node
    dests = [tmp_path / f"node-{n}" / saved.name for n in range(nodes)]
    out = tmp_path / "out"
    out.mkdir()
    payload = {
        "endpoint": moto_endpoint,
        "root": f"s3://{versioned_bucket}/job/{saved.name}",
        "objects": [o.__dict__ for o in objects],
        "dests": [str(d) for d in dests],
        "per_node": per_node,
        "out": str(out),
        "chunk": 4096,  # many chunks: a leader forwards one while it receives the next
    }
    # WHEN they run the restart's node part (header, split table, relay, each leader's restore)
    assert dcp_share_job.in_fresh_process("restore", payload) == 0
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    gets = [g for r in ranks for g in r["gets"]]
    # THEN .metadata was read from S3 once in the whole job (by rank 0), not once per node
    assert sum(g.split(" ")[0].endswith("/.metadata") for g in gets) == 1, gets
    # AND every other leader received the same relay and read no replicated item from S3: what
    # it GET of files its ranks did not store is a chunk its ranks load (HSDP's ``h``: the
    # replica of a shard stored in another node's file)
    shared = relay.shared_ranges({"": items})
    leaders = range(per_node, WORLD, per_node)
    assert {ranks[r]["relayed"] for r in leaders} == {ranks[0]["relayed"]}
    assert all(ranks[r]["relayed"] == 0 for r in range(WORLD) if r % per_node)
    for leader in leaders:
        own = {f"__{r}_0.distcp" for r in range(leader, leader + per_node)}
        for line in ranks[leader]["gets"]:
            key, _, span = line.partition(" ")
            name = key.rsplit("/", 1)[-1]
            if name in own:
                continue
            first, last = (int(x) for x in span.removeprefix("bytes=").split("-"))
            assert not any(o <= first and last < o + n for o, n in shared.get(name, ())), line
    # AND every rank's dcp.load from its node's directory gives the saved state
    directories = {str(r): str(dests[r // per_node]) for r in range(WORLD)}
    assert dcp_share_job.in_fresh_process("load", directories) == 0


def test_the_relay_holds_a_part_only_where_one_range_holds_it_whole() -> None:
    # GIVEN two relayed ranges of one file, and a relay through its wire form
    pieces = ((100, b"a" * 50), (1000, b"b" * 10))
    wire = relay.unpack(relay.pack(relay.Relay({".metadata": b"m"}, {"f": pieces})))
    assert wire == relay.Relay({".metadata": b"m"}, {"f": pieces})
    # THEN a part inside one is served from it; one across its end or between them is not
    assert held(pieces, 110, 20) == b"a" * 20
    assert held(pieces, 1000, 10) == b"b" * 10
    assert held(pieces, 140, 20) is None
    assert held(pieces, 0, 10) is None and held(pieces, 500, 10) is None


def test_a_relayed_metadata_that_is_not_the_reported_one_sends_the_leader_to_s3(
    saved: Path,
) -> None:
    # GIVEN the checkpoint's rows, .metadata pinned by its SHA-256
    data = (saved / ".metadata").read_bytes()
    objects = [
        RemoteObject(o.uri, o.relative, o.bytes, hashlib.sha256(data).hexdigest())
        if o.relative == ".metadata"
        else o
        for o in _objects(saved)
    ]
    # THEN the relayed bytes are read when they are the reported ones
    read = relay.read_from(relay.Relay({".metadata": data}), objects)
    assert read is not None and read.dcp[""] == _items(saved)
    # AND otherwise (changed, or missing) the leader gets nothing and reads S3 itself
    assert relay.read_from(relay.Relay({".metadata": data + b"x"}), objects) is None
    assert relay.read_from(relay.Relay({}), objects) is None
