"""Which objects of a checkpoint a node restores: what its ranks will load, and nothing else
(pure: no I/O; :mod:`trainer_client.restart.node_fetch` reads ``.metadata`` and restores).

Every rank of a checkpoint's files is attributed by name (:mod:`trainer_client.storage.layouts`,
:mod:`trainer_client.storage.hf_layout`):
a file whose name carries a rank (``__<r>_<n>.distcp``, ``*zero_pp_rank_<r>_*``,
``rng_state_<r>.pth``, ``*_rank<r>.bin``) is loaded by that rank; every other file (the model and
optimizer of the HF ``Trainer``, ``trainer_state.json``, DCP's ``.metadata``, Lightning's
``meta.pt`` and ``.ckpt``, DeepSpeed's ``mp_rank_00_model_states.pt`` and ``latest``) by every
rank. With the world size unchanged, a node fetches the common files and its own ranks' files:

* **DeepSpeed ZeRO**: a rank loads its own partition only (``_get_all_zero_checkpoint_state_dicts``
  in deepspeed 0.19 reads the others only with ``zero_optimization.elastic_checkpoint``);
* **HF ``Trainer``**: ``rng_state_<process_index>.pth`` of its own, the rest in common;
* **DCP**: DCP's save planner keeps one copy of every item several ranks hold (``dedup_save_plans``:
  the least loaded rank's file, or the lowest rank's with ``dedup_save_to_lowest_rank``), so a
  rank also reads items stored in other ranks' files. ``.metadata`` says where each item is
  (``storage_data``: file, offset, length): a replicated item (one chunk, or bytes) is read by
  every rank, a shard of a sharded tensor by the rank that stored it. A rank that stored no chunk
  of a sharded tensor (an HSDP replica, an empty shard) holds a copy of a chunk another rank
  stored: when the tensor's chunks, in offset order, were each stored by a rank ``r`` with
  ``r mod chunks`` equal to the chunk's position (HSDP's mesh: ranks ``i × shards + j`` hold
  shard ``j``), that rank reads chunk ``rank mod chunks``; otherwise the node takes every
  chunk. The node fetches its ranks' files whole and, of the others, only the byte ranges of
  those items, into a sparse file at the same offsets (DCP's ``FileSystemReader`` seeks to
  ``offset`` and reads ``length``).

After a change of world size a rank may read any chunk (resharding): the node fetches everything.
Without ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (not launched by torchrun) this node's ranks are not
known: it fetches what every rank loads, i.e. everything.
"""

from __future__ import annotations

import functools
import posixpath
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer_client.exceptions import LayoutError
from trainer_client.storage.committed import DCP_METADATA
from trainer_client.storage.hf_layout import process_index_in_name
from trainer_client.storage.layouts import DCP_SUFFIX, rank_in_name
from trainer_client.storage.restore import RemoteObject

# Two wanted ranges of one file closer than this are fetched as one GET (the bytes between them
# too): DCP writes small items next to each other (bytes first, then tensors by size), and one
# request for a few KiB more costs less than a request.
MERGE_GAP_BYTES = 64 * 1024

Range = tuple[int, int]  # (offset, length)


@dataclass(frozen=True)
class NodeRanks:
    """The global ranks on this node (contiguous under torchrun: an agent's workers take
    ``GROUP_RANK``'s block of ranks) and the job's current world size."""

    ranks: range
    world_size: int
    # From torchrun's variables (else this process cannot know which ranks share its disk).
    known: bool = True

    @classmethod
    def of(
        cls, *, rank: int, world_size: int, local_rank: str | None, local_world_size: str | None
    ) -> NodeRanks:
        """From torchrun's variables; the whole job when they are missing or do not fit."""
        try:
            local, count = int(local_rank or ""), int(local_world_size or "")
        except ValueError:
            return cls(range(world_size), world_size, known=False)
        first = rank - local
        if not (0 <= local < count and first >= 0 and first + count <= world_size):
            return cls(range(world_size), world_size, known=False)
        return cls(range(first, first + count), world_size)


@dataclass(frozen=True)
class StoredItem:
    """One item of a DCP checkpoint where ``.metadata`` says it is stored."""

    fqn: str
    file: str  # relative to the DCP directory
    offset: int
    length: int
    # One of several chunks of a tensor (read by the rank holding that shard); else every rank
    # reads it (a tensor stored whole, or a bytes item).
    sharded: bool
    # The chunk's offset in the tensor (DCP's MetadataIndex.offset); () for a bytes item.
    chunk: tuple[int, ...] = ()
    # The tensor has an empty chunk (more ranks than rows): its chunks do not follow a mesh.
    uneven: bool = False


@dataclass(frozen=True)
class NodeShare:
    """What this node restores: the objects, and of some only byte ranges (by relative name)."""

    objects: tuple[RemoteObject, ...]
    ranges: Mapping[str, tuple[Range, ...]] = field(default_factory=dict)
    # Why the node fetches everything, when it does ("" when it fetches its share).
    whole_because: str = ""

    @property
    def bytes(self) -> int:
        """The bytes this share fetches."""
        return sum(
            sum(n for _, n in self.ranges[o.relative]) if o.relative in self.ranges else o.bytes
            for o in self.objects
        )


def stored_items(metadata: Any) -> list[StoredItem]:
    """The items of a DCP ``Metadata`` (``torch.distributed.checkpoint.metadata``), read by
    attribute so that this module needs no torch."""
    chunks = {
        fqn: list(getattr(meta, "chunks", None) or ())
        for fqn, meta in metadata.state_dict_metadata.items()
    }
    # Once per tensor, not per chunk: at 100,000 ranks a tensor has 100,000 chunks.
    sharded = {fqn: len(c) > 1 for fqn, c in chunks.items()}
    uneven = {fqn: any(0 in tuple(x.sizes) for x in c) for fqn, c in chunks.items()}
    return [
        StoredItem(
            index.fqn,
            info.relative_path,
            int(info.offset),
            int(info.length),
            sharded[index.fqn],
            tuple(int(x) for x in (index.offset or ())),
            uneven[index.fqn],
        )
        for index, info in metadata.storage_data.items()
    ]


# Memoized: node_rows and dcp_reads ask it several times of each of 100,000 files at that scale.
@functools.lru_cache(maxsize=2**18)
def _rank_of(relative: str) -> int | None:
    try:
        marked = rank_in_name(relative)
    except LayoutError:
        return None  # another model-parallel rank's file: not attributed, so every node takes it
    return marked if marked is not None else process_index_in_name(relative)


def merge(ranges: Iterable[Range], gap: int = MERGE_GAP_BYTES) -> tuple[Range, ...]:
    """``ranges`` sorted, with those that overlap or lie within ``gap`` bytes joined."""
    merged: list[list[int]] = []
    for offset, length in sorted(ranges):
        if merged and offset <= merged[-1][0] + merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], offset + length - merged[-1][0])
        else:
            merged.append([offset, length])
    return tuple((o, n) for o, n in merged)


@dataclass(frozen=True)
class _Chunks:
    """Who stored each sharded tensor's chunks, each chunk's position, and whether every
    tensor's chunks follow HSDP's mesh (see the module docstring)."""

    storers: Mapping[str, set[int | None]]
    count: Mapping[str, int]
    position: Mapping[tuple[str, tuple[int, ...]], int]
    meshed: bool

    def everyone_reads(self, item: StoredItem) -> bool:
        """Whether a rank other than its storer may read ``item`` wherever it is."""
        return not item.sharded or item.uneven or not self.meshed


def _chunks(items: Sequence[StoredItem]) -> _Chunks:
    storers: dict[str, set[int | None]] = defaultdict(set)
    offsets: dict[str, set[tuple[int, ...]]] = defaultdict(set)
    for item in items:
        if item.sharded:
            storers[item.fqn].add(_rank_of(item.file))
            offsets[item.fqn].add(item.chunk)
    position = {
        (fqn, chunk): index
        for fqn, chunks in offsets.items()
        for index, chunk in enumerate(sorted(chunks))
    }
    # Whether every tensor's chunks were stored as HSDP's mesh places them (see the module
    # docstring): checked over all of them, so that no tensor matches by chance.
    meshed = not any(
        (rank := _rank_of(item.file)) is None
        or rank % len(offsets[item.fqn]) != position[item.fqn, item.chunk]
        for item in items
        if item.sharded and not item.uneven
    )
    return _Chunks(storers, {f: len(c) for f, c in offsets.items()}, position, meshed)


def everyone_reads_items(items: Sequence[StoredItem]) -> list[StoredItem]:
    """The items of a DCP directory in a rank's file that any other rank may read (replicated
    items, chunks that follow no mesh): every node that does not own the file reads them."""
    chunks = _chunks(items)
    return [i for i in items if _rank_of(i.file) is not None and chunks.everyone_reads(i)]


def dcp_reads(items: Sequence[StoredItem], ranks: range) -> dict[str, tuple[Range, ...] | None]:
    """The files of a DCP directory the ranks ``ranks`` read, each with the ranges they read
    (None: the whole file), with the world size unchanged (see the module docstring)."""
    chunks = _chunks(items)

    def read_by(item: StoredItem, rank: int) -> bool:
        if not item.sharded:
            return True
        if rank in chunks.storers[item.fqn]:
            return False  # its own chunk, in its own file
        if chunks.everyone_reads(item):
            return True  # it may hold any chunk
        return rank % chunks.count[item.fqn] == chunks.position[item.fqn, item.chunk]

    wanted: dict[str, list[Range]] = defaultdict(list)
    whole: set[str] = set()
    for item in items:
        owner = _rank_of(item.file)
        if owner is None:
            whole.add(item.file)  # a file no rank's name marks: no partial guess
        elif owner in ranks:
            whole.add(item.file)
        elif any(read_by(item, r) for r in ranks):
            wanted[item.file].append((item.offset, item.length))
    reads: dict[str, tuple[Range, ...] | None] = {f: None for f in whole}
    for name, ranges in wanted.items():
        if name not in whole:
            reads[name] = merge(ranges)
    return reads


def node_share(
    objects: Sequence[RemoteObject],
    *,
    node: NodeRanks,
    saved_world_size: int,
    dcp: Mapping[str, Sequence[StoredItem]],
) -> NodeShare:
    """The share of ``objects`` (a checkpoint's, relative names) that ``node``'s ranks load.

    ``dcp``: for each DCP directory among them (relative, "" for the root), the items its
    ``.metadata`` lists (:func:`stored_items`); a DCP directory missing from it is fetched whole.
    """
    if node.world_size != saved_world_size:
        return NodeShare(
            tuple(objects),
            whole_because=f"saved by {saved_world_size} ranks, resumed by {node.world_size}",
        )
    if len(node.ranks) == node.world_size:
        return NodeShare(tuple(objects), whole_because="this node runs every rank")
    by_dir: dict[str, dict[str, RemoteObject]] = defaultdict(dict)
    for obj in objects:
        directory, _, name = obj.relative.rpartition("/")
        by_dir[directory][name] = obj
    chosen: list[RemoteObject] = []
    ranges: dict[str, tuple[Range, ...]] = {}
    for directory, files in by_dir.items():
        is_dcp = DCP_METADATA in files and any(n.endswith(DCP_SUFFIX) for n in files)
        if is_dcp and directory not in dcp:
            chosen += files.values()  # its .metadata was not read: every file, whole
            continue
        reads = dcp_reads(dcp[directory], node.ranks) if is_dcp else {}
        if absent := sorted(set(reads) - set(files)):
            # A node leader's table (wire_table.py) must hold every file its ranks read.
            raise LayoutError(f"{directory or '.'}/.metadata names {absent[0]}, not in the table")
        for name, obj in files.items():
            if is_dcp and name.endswith(DCP_SUFFIX):
                if name not in reads:
                    continue  # no item any of the node's ranks reads
                part = reads[name]
                if part is not None and sum(n for _, n in part) < obj.bytes:
                    ranges[obj.relative] = part
                chosen.append(obj)
            elif (rank := _rank_of(name)) is None or rank in node.ranks:
                chosen.append(obj)
    return NodeShare(tuple(chosen), ranges)


def dcp_directories(objects: Iterable[RemoteObject]) -> list[str]:
    """The DCP directories (relative, "" for the root) among a checkpoint's objects: those with
    a ``.metadata`` and ``.distcp`` files."""
    names = [posixpath.split(o.relative) for o in objects]
    metadata = {directory for directory, name in names if name == DCP_METADATA}
    return sorted(metadata & {directory for directory, name in names if name.endswith(DCP_SUFFIX)})


@dataclass(frozen=True)
class NodeRows:
    """The rows of a checkpoint's objects each node's :func:`node_share` may name: ``common``
    (every node's) and, per node, its ``own`` besides them (indices into the objects)."""

    common: list[int]
    own: list[list[int]]


def node_rows(
    objects: Sequence[RemoteObject],
    *,
    per_node: int,
    world_size: int,
    dcp: Mapping[str, Sequence[StoredItem]],
) -> NodeRows:
    """For each node of ``per_node`` ranks (node ``i``: ranks ``i × per_node`` on), the objects
    its :func:`node_share` may name, with the world size unchanged: a superset, computed once
    for every node in time linear in the objects, the items and the ranks.

    Common: a file any rank may read (no rank in its name, a replicated item, a chunk whose
    readers follow no mesh, a DCP directory whose ``.metadata`` is not in ``dcp``). Own: a
    rank's own files, and a file holding a meshed chunk at position ``p`` of ``c`` for the
    nodes with a rank ``r`` where ``r mod c == p``.
    """
    everyone: set[int] = set()
    owned: dict[int, set[int]] = defaultdict(set)
    meshed: dict[tuple[int, int], set[int]] = defaultdict(set)
    index = {o.relative: i for i, o in enumerate(objects)}
    for at, obj in enumerate(objects):
        directory, _, name = obj.relative.rpartition("/")
        rank = _rank_of(name)
        if rank is None or (name.endswith(DCP_SUFFIX) and directory not in dcp):
            everyone.add(at)
        else:
            owned[rank // per_node].add(at)
    for directory, items in dcp.items():
        chunks = _chunks(items)
        for item in items:
            at_file = index.get(posixpath.join(directory, item.file))
            if at_file is None:
                continue  # node_share refuses it: .metadata names a file the objects lack
            if _rank_of(item.file) is None or chunks.everyone_reads(item):
                everyone.add(at_file)
            else:
                key = (chunks.count[item.fqn], chunks.position[item.fqn, item.chunk])
                meshed[key].add(at_file)
    counts = {count for count, _ in meshed}
    own = []
    for node in range(world_size // per_node):
        rows = set(owned.get(node, ()))
        for count in counts:  # per rank of the node, not per chunk: linear in the ranks
            for rank in range(node * per_node, (node + 1) * per_node):
                rows |= meshed.get((count, rank % count), set())
        own.append(sorted(rows - everyone))
    return NodeRows(sorted(everyone), own)
