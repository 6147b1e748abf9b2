"""The bytes every node reads, read from S3 once and handed on by the node leaders: each DCP
directory's ``.metadata`` and the items every rank loads from other ranks' files (replicated
tensors, bytes items, an optimizer's step).

Why: a key is one S3 prefix whatever the key layout, and S3 serves about 5,500 GET/s per
partitioned prefix. At 12,500 nodes, a ``.metadata`` that every node GETs is 12,500 requests on
one prefix (2.3 s, nine times a node's transfer of its shards), and with DCP's balanced dedup
each of ~1,000 files holding a replicated item takes a ranged GET from every node: the spread of
the keys (``UploadSettings.spread_prefixes``) cannot cut a request rate on one key. Rank 0 has
read ``.metadata`` before it splits the object table (:mod:`.wire_table`); it also fetches the
replicated items' byte ranges (one ranged GET each, the pinned version, as a node's restore
would make), and the leaders pass the bytes down a binary tree of leaders
(:func:`~.wire_table.pass_down`): each leader receives them once and sends them to at most two
others, so S3 sees one GET per key.

What a leader does with them: ``.metadata`` is checked against its row's SHA-256 before it is
unpickled (else the leader reads it from S3, as without the relay); the ranges go to the restore
(``relayed``), which writes a part from them when one holds it whole and GETs it otherwise. The
ranges carry no checksum of their own (nor does a ranged GET: the version is pinned, and the node
that owns the file hashes it whole); they are the bytes rank 0's pinned GET returned.

Bounded: ranges over :data:`RELAY_MAX_BYTES` in all (a layout where every rank may read every
chunk) are not relayed, and each node GETs its own, as before.
"""

from __future__ import annotations

import hashlib
import pickle
import posixpath
import struct
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trainer_client.restart.decide import Decision
from trainer_client.restart.node_fetch import NodeFetch
from trainer_client.restart.node_share import (
    NodeShare,
    Range,
    StoredItem,
    dcp_directories,
    everyone_reads_items,
    merge,
    stored_items,
)
from trainer_client.restart.wire_table import RELAY_CHUNK, Received, pass_down
from trainer_client.storage.committed import DCP_METADATA
from trainer_client.storage.restore import DEFAULT_PART_BYTES, RemoteObject
from trainer_client.storage.restore_fetch import get_range, spans_of
from trainer_client.storage.verify import VERIFY_MAX_WORKERS

# What rank 0 relays at most, .metadata excluded: replicated items are small (an optimizer's step,
# a buffer), and a tree of leaders moves 64 MiB in ~20 ms a hop at 25 Gbit/s.
RELAY_MAX_BYTES = 64 * 2**20
# Rank 0's ranged GETs of the replicated items at once: small and latency-bound, like the
# verification's HEADs (storage/verify.py's VERIFY_MAX_WORKERS), not the restore's 8 MiB parts
# (the restart's client has a pool this large).
RELAY_GET_WORKERS = VERIFY_MAX_WORKERS
_HEAD = struct.Struct("<BHqq")  # kind (0: a whole file, 1: a range), name length, offset, length
_WHOLE, _RANGE = 0, 1


@dataclass(frozen=True)
class Relay:
    """The bytes rank 0 hands the leaders: whole files (``.metadata``, by relative name) and
    byte ranges of others (by relative name: (offset, bytes), sorted)."""

    whole: Mapping[str, bytes] = field(default_factory=dict)
    ranges: Mapping[str, tuple[tuple[int, bytes], ...]] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(map(len, self.whole.values())) + sum(
            len(data) for pieces in self.ranges.values() for _, data in pieces
        )


def shared_ranges(dcp: Mapping[str, Sequence[StoredItem]]) -> dict[str, tuple[Range, ...]]:
    """The byte ranges every node may read of each DCP file (by relative name, merged as a
    node's share merges them): the items any rank may read wherever they are stored."""
    wanted: dict[str, list[Range]] = defaultdict(list)
    for directory, items in dcp.items():
        for item in everyone_reads_items(items):
            wanted[posixpath.join(directory, item.file)].append((item.offset, item.length))
    return {name: merge(ranges) for name, ranges in wanted.items()}


def gather(
    objects: Sequence[RemoteObject],
    read: NodeFetch,
    *,
    client: Any,
    max_workers: int,
    limit: int = RELAY_MAX_BYTES,
) -> Relay:
    """Rank 0's relay: the ``.metadata`` it read (``read``) and the shared ranges, fetched by
    ranged GETs of the pinned versions (none when they exceed ``limit``)."""
    by_name = {o.relative: o for o in objects}
    wanted = {n: r for n, r in shared_ranges(read.dcp).items() if n in by_name}
    if sum(n for ranges in wanted.values() for _, n in ranges) > limit:
        wanted = {}
    jobs = [
        (name, offset, length)
        for name, ranges in wanted.items()
        for offset, length in spans_of(by_name[name].bytes, DEFAULT_PART_BYTES, ranges)
        if length
    ]
    # No more at once than the client's connection pool holds (urllib3 would open and discard
    # the others, warning each time).
    config = getattr(getattr(client, "meta", None), "config", None)
    pool_size = getattr(config, "max_pool_connections", None) or max_workers
    workers = max(1, min(RELAY_GET_WORKERS, max(max_workers, pool_size), len(jobs)))
    with ThreadPoolExecutor(workers) as pool:
        fetched = list(
            pool.map(lambda j: get_range(client, by_name[j[0]], j[1], j[1] + j[2] - 1), jobs)
        )
    # One piece per range, its parts joined: a node's span that straddles two parts (its range
    # starts elsewhere, merged with a chunk of its own mesh) still finds one piece holding it.
    pieces: dict[str, list[tuple[int, bytearray]]] = defaultdict(list)
    for (name, offset, _), data in zip(jobs, fetched, strict=True):
        joined = pieces[name]
        if joined and joined[-1][0] + len(joined[-1][1]) == offset:
            joined[-1][1].extend(data)
        else:
            joined.append((offset, bytearray(data)))
    ranges = {n: tuple((o, bytes(d)) for o, d in p) for n, p in pieces.items()}
    return Relay(dict(read.preloaded), ranges)


def pack(relay: Relay) -> bytes:
    out = bytearray()
    entries = [(_WHOLE, n, 0, d) for n, d in relay.whole.items()]
    entries += [(_RANGE, n, o, d) for n, pieces in relay.ranges.items() for o, d in pieces]
    for kind, name, offset, data in entries:
        encoded = name.encode()
        out += _HEAD.pack(kind, len(encoded), offset, len(data)) + encoded + data
    return bytes(out)


def unpack(data: bytes) -> Relay:
    whole: dict[str, bytes] = {}
    ranges: dict[str, list[tuple[int, bytes]]] = defaultdict(list)
    view = memoryview(data)
    at = 0
    while at < len(data):
        kind, name_len, offset, length = _HEAD.unpack_from(data, at)
        at += _HEAD.size
        name = bytes(view[at : at + name_len]).decode()
        at += name_len
        body = bytes(view[at : at + length])
        at += length
        if kind == _WHOLE:
            whole[name] = body
        else:
            ranges[name].append((offset, body))
    return Relay(whole, {n: tuple(sorted(p)) for n, p in ranges.items()})


def read_from(relay: Relay, objects: Sequence[RemoteObject]) -> NodeFetch | None:
    """A leader's reading of ``.metadata`` from the relay: every DCP directory's, each with its
    row's SHA-256 (checked before it is unpickled); None when one is missing or differs (the
    leader then reads them from S3)."""
    by_name = {o.relative: o for o in objects}
    dcp: dict[str, list[StoredItem]] = {}
    preloaded: dict[str, bytes] = {}
    for directory in dcp_directories(objects):
        name = posixpath.join(directory, DCP_METADATA)
        data, pinned = relay.whole.get(name), by_name[name].sha256
        if data is None or pinned is None or hashlib.sha256(data).hexdigest() != pinned:
            return None
        # Verified against the reports: the same trust as dcp.load's own pickle.load of it.
        dcp[directory] = stored_items(pickle.loads(data))
        preloaded[name] = data
    return NodeFetch(NodeShare(()), preloaded, 0, dcp)


def receive(
    dist: Any,
    held: Received,
    rank: int,
    decision: Decision,
    read: NodeFetch | None,
    *,
    client: Any,
    max_workers: int,
    chunk: int = RELAY_CHUNK,
) -> tuple[NodeFetch | None, Relay]:
    """The relay on this node leader (a collective of the leaders, after
    :func:`~.wire_table.share_table`): its ``.metadata`` reading from it (rank 0 passes its own
    as ``read`` and keeps it; a leader whose relay lacks it gets None and reads S3) and the
    relayed ranges for its restore."""

    def make() -> bytes:
        if read is None:
            return b""
        return pack(gather(decision.objects, read, client=client, max_workers=max_workers))

    data = pass_down(dist, held, rank=rank, make=make, chunk=chunk)
    try:
        relayed = unpack(data)
        if rank != 0 and relayed.whole:
            read = read_from(relayed, decision.objects)
    except Exception:  # not raised here: every rank must reach the restore's agreement
        return (read if rank == 0 else None), Relay()
    return read, relayed
