"""The decision on every rank, its object table only where a node restores: the bytes a rank
receives do not grow with the number of ranks.

Every rank receives the decision's header (:func:`~.wire_decision.to_bytes` without rows: the
checkpoint, the launch, a few bounded fields) in one broadcast. The table (one row per object)
goes only to each node's first rank, the one that restores for its node (a local rank 0 under
torchrun), and holds only the rows its node may fetch (:func:`~.node_share.node_rows`: the
common files, its ranks' own, for DCP the other ranks' files its load plans read, which rank 0
knows from ``.metadata``, read once before it sends). The node's other ranks wait for that
restore (:func:`~.wire.all_succeeded`) and take the copy as it is.

Two steps, so that the decision (the header) does not wait for the split: every rank holds the
header (:func:`share_header`), then rank 0 reads ``.metadata``, splits and sends the tables
(:func:`share_table`; its own node's restore would have read ``.metadata`` anyway, and reuses it)
while the node's other ranks already wait for their leader's restore. How the tables travel:
rank 0 sends each node leader its table's length (8 bytes), then the table (the rows every node
needs encoded once, then the node's own), by point-to-point ``isend``/``irecv`` in
``batch_isend_irecv`` batches; a leader posts one ``irecv`` for each. Chosen over the
alternatives: a scatter over the whole world would hand every rank a padded table (not
"nothing" to non-leaders); a scatter in a subgroup of leaders needs ``new_group`` called by
every rank with the same list of leaders (one more rendezvous at start-up, and a list that
grows with the nodes) and a second NCCL communicator; single ``send``/``recv`` on NCCL open
one two-rank communicator per pair (12,500 of them at rank 0), while ``batch_isend_irecv``
coalesces on the default group's communicator
(``ProcessGroupNCCL::pointToPoint``'s batched path). Rank 0 sends O(nodes) tables: it read the
database, so it holds the whole table anyway.

Then the relay (:func:`pass_down`, :mod:`.relay`): what every node reads of the checkpoint
(``.metadata``, the replicated items' ranges), fetched once by rank 0, goes down a binary tree of
the leaders in chunks. It is checkpoint data a leader would otherwise GET, and grows with
``.metadata``; the other ranks receive none of it.

Where the table is not split, every rank receives it whole, as before: at another world size
than the checkpoint's (every node then fetches everything, so its table is the whole table),
and where a rank's node is not known from torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` or the
nodes are not blocks of one size (one all-reduce of three integers says so).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from trainer_client.restart.decide import Decision
from trainer_client.restart.lookup import ResumePoint
from trainer_client.restart.node_share import NodeRanks, NodeRows, StoredItem, node_rows
from trainer_client.restart.wire import all_reduce_ints, broadcast_bytes, collective_device
from trainer_client.restart.wire_decision import (
    header_from_bytes,
    rows_from_bytes,
    rows_to_bytes,
    to_bytes,
)
from trainer_client.storage.restore import RemoteObject

# Sends rank 0 keeps in flight at once (one batch_isend_irecv each).
SEND_BATCH = 256
# The relay's chunk (pass_down): 1 MiB is 0.34 ms at 25 Gbit/s, long beside a hop's latency.
RELAY_CHUNK = 2**20
_LENGTH = struct.Struct("<q")

# Rank 0's reading of each DCP directory's ``.metadata`` (by directory), for the tables.
ReadItems = Callable[[Decision], Mapping[str, Sequence[StoredItem]]]


@dataclass(frozen=True)
class Received:
    """What this rank holds of the decision after :func:`share_header`."""

    # Its objects: all where the table is not split and on rank 0 (which read them), else none
    # until :func:`share_table`.
    decision: Decision
    # The checkpoint's number of objects, wherever its rows are.
    objects: int
    # This rank restores for its node (else it waits for the rank that does).
    restores: bool
    # The table follows by node (:func:`share_table`), in blocks of this many ranks (0: not).
    block: int = 0


def per_node(dist: Any, node: NodeRanks) -> int | None:
    """The ranks per node when every rank's node is known and the nodes are aligned blocks of
    one size (a collective: one all-reduce MAX of three integers), else None."""
    size = len(node.ranks)
    odd = int(not node.known or node.ranks.start % size != 0)
    most, least, bad = all_reduce_ints(dist, [size, -size, odd], "max")
    return None if bad or most != -least else most


def share_header(dist: Any, decision: Decision | None, *, rank: int, node: NodeRanks) -> Received:
    """Rank 0's ``decision`` on every rank, its rows only where the table is not split (a
    collective: every rank calls it; see the module docstring)."""
    world = int(dist.get_world_size())
    block = per_node(dist, node) or 0
    if rank != 0:
        shared, count, split = header_from_bytes(broadcast_bytes(dist, None))
        if not split:
            return Received(shared, count, True)
        return Received(shared, count, rank == node.ranks.start, split)
    assert decision is not None
    point = decision.point
    if not (block and point is not None and decision.objects and point.world_size == world):
        block = 0
    broadcast_bytes(dist, to_bytes(decision, rows=not block, split=block))
    return Received(decision, len(decision.objects), True, block)


def share_table(dist: Any, held: Received, *, rank: int, read_items: ReadItems) -> Decision:
    """This node leader's rows (rank 0 sends them; the other ranks return at once): the
    decision with them, after :func:`share_header` split the table."""
    decision = held.decision
    world = int(dist.get_world_size())
    if not held.block or not held.restores or held.block >= world:
        return decision  # not split, not a leader, or one node: rank 0 holds every row
    if rank != 0:
        return replace(decision, objects=_table(decision.point, _receive(dist, 0)))
    point = decision.point
    nodes = world // held.block
    try:
        rows = node_rows(
            decision.objects, per_node=held.block, world_size=world, dcp=read_items(decision)
        )
    except Exception:  # the leaders wait in irecv: they get every row rather than hang
        rows = NodeRows(list(range(len(decision.objects))), [[] for _ in range(nodes)])
    # Every node's common rows, encoded once (at 12,500 nodes, not 12,500 times).
    common = _framed(rows_to_bytes(point, [decision.objects[i] for i in rows.common]))
    tables = [
        common + _framed(rows_to_bytes(point, [decision.objects[i] for i in own]))
        for own in rows.own[1:]
    ]
    _send(dist, [(node * held.block, t) for node, t in enumerate(tables, start=1)])
    return decision


def pass_down(
    dist: Any,
    held: Received,
    *,
    rank: int,
    make: Callable[[], bytes],
    chunk: int = RELAY_CHUNK,
) -> bytes:
    """The bytes every node reads (:mod:`.relay`), on every node leader after
    :func:`share_table`: rank 0 ``make``-s them, each leader receives them from its parent in a
    binary tree of the leaders (node ``k``'s parent is node ``(k - 1) // 2``) and sends them to
    its children, so no rank sends them more than twice. In chunks (:data:`RELAY_CHUNK`), a
    leader forwarding one while it receives the next: the deepest of 12,500 leaders (13 hops)
    has 13 MB after about 3 × 13 + 2 × 13 chunk times instead of 13 × 3 whole ones. b"" on the other
    ranks and where the table is not split (every node reads S3)."""
    world = int(dist.get_world_size())
    if not held.block or not held.restores or held.block >= world:
        return b""
    node, nodes = rank // held.block, world // held.block
    children = [child * held.block for child in (2 * node + 1, 2 * node + 2) if child < nodes]
    parent = None if rank == 0 else (node - 1) // 2 * held.block
    if parent is None:
        try:
            data = bytearray(make())
        except Exception:  # the leaders wait in irecv: an empty relay sends them to S3
            data = bytearray()
        _send(dist, [(child, _LENGTH.pack(len(data))) for child in children])
    else:
        (size,) = _LENGTH.unpack(_receive(dist, parent))
        _send(dist, [(child, _LENGTH.pack(size)) for child in children])
        data = bytearray(size)
    _pass_chunks(dist, data, parent, children, chunk)
    return bytes(data)


def _pass_chunks(
    dist: Any, data: bytearray, parent: int | None, children: Sequence[int], size: int
) -> None:
    """``data`` received chunk by chunk from ``parent`` (None: it holds them) and each chunk sent
    to ``children`` while the next one arrives."""
    import torch

    device = collective_device(dist)
    sending: tuple[list[Any], Any] = ([], None)  # the works, and the chunk they send
    for start in range(0, len(data), size):
        end = min(start + size, len(data))
        if parent is None:
            chunk = torch.frombuffer(data, dtype=torch.uint8)[start:end].to(device)
        else:
            chunk = torch.empty(end - start, dtype=torch.uint8, device=device)
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, chunk, parent)]):
                work.wait()
            data[start:end] = chunk.cpu().numpy().tobytes()
        for work in sending[0]:  # the previous chunk's sends: one chunk in flight per child
            work.wait()
        ops = [dist.P2POp(dist.isend, chunk, child) for child in children]
        sending = (list(dist.batch_isend_irecv(ops)) if ops else [], chunk)
    for work in sending[0]:
        work.wait()


def _framed(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


def _send(dist: Any, messages: Sequence[tuple[int, bytes]]) -> None:
    """Each ``(rank, data)``: its length (8 bytes), then the bytes, in batches of sends."""
    import torch

    device = collective_device(dist)
    for first in range(0, len(messages), SEND_BATCH):
        batch = messages[first : first + SEND_BATCH]
        for framed in (False, True):  # the lengths, then the bytes
            ops = []
            for peer, message in batch:
                if framed and not message:
                    continue  # the receiver posts no irecv for nothing
                data = bytearray(message if framed else _LENGTH.pack(len(message)))
                tensor = torch.frombuffer(data, dtype=torch.uint8).to(device)
                ops.append(dist.P2POp(dist.isend, tensor, peer))
            for work in dist.batch_isend_irecv(ops) if ops else ():
                work.wait()


def _receive(dist: Any, peer: int) -> bytes:
    """What :func:`_send` sent this rank from ``peer``."""
    import torch

    device = collective_device(dist)
    length = torch.empty(_LENGTH.size, dtype=torch.uint8, device=device)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, length, peer)]):
        work.wait()
    (size,) = _LENGTH.unpack(length.cpu().numpy().tobytes())
    tensor = torch.empty(size, dtype=torch.uint8, device=device)
    if size:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensor, peer)]):
            work.wait()
    return bytes(tensor.cpu().numpy().tobytes())


def _table(point: ResumePoint | None, framed: bytes) -> tuple[RemoteObject, ...]:
    """A node leader's table: the common rows, then its own."""
    rows: list[RemoteObject] = []
    at = 0
    while at < len(framed):
        (length_of,) = _LENGTH.unpack_from(framed, at)
        rows += rows_from_bytes(point, framed[at + _LENGTH.size : at + _LENGTH.size + length_of])
        at += _LENGTH.size + length_of
    return tuple(rows)
