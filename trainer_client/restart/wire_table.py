"""The decision on every rank, its object table only where a node restores: the bytes a rank
receives do not grow with the number of ranks.

Every rank receives the decision's header (:func:`~.wire_decision.to_bytes` without rows: the
checkpoint, the launch, a few bounded fields) in one broadcast. The table (one row per object)
goes only to each node's first rank, the one that restores for its node (a local rank 0 under
torchrun), and holds only the rows its node may fetch (:func:`~.node_share.node_rows`: the
common files, its ranks' own, for DCP the other ranks' files its load plans read, which rank 0
knows from ``.metadata``, read once before it sends). The node's other ranks wait for that
restore (:func:`~.wire.all_succeeded`) and take the copy as it is.

How the tables travel: rank 0 sends each node leader its table, padded to the longest so that
the header can say one size, by point-to-point ``isend``/``irecv`` in ``batch_isend_irecv``
batches; a leader posts one ``irecv``. Chosen over the alternatives: a scatter over the whole
world would hand every rank a padded table (not "nothing" to non-leaders); a scatter in a
subgroup of leaders needs ``new_group`` called by every rank with the same list of leaders (one
more rendezvous at start-up, and a list that grows with the nodes) and a second NCCL
communicator; single ``send``/``recv`` on NCCL open one two-rank communicator per pair (12,500
of them at rank 0), while ``batch_isend_irecv`` coalesces on the default group's communicator
(``ProcessGroupNCCL::pointToPoint``'s batched path). Rank 0 sends O(nodes) tables: it read the
database, so it holds the whole table anyway.

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
from trainer_client.restart.node_share import NodeRanks, StoredItem, node_rows
from trainer_client.restart.wire import all_reduce_ints, broadcast_bytes, collective_device
from trainer_client.restart.wire_decision import decode, rows_from_bytes, rows_to_bytes, to_bytes

# Sends rank 0 keeps in flight at once (one batch_isend_irecv each).
SEND_BATCH = 256
_LENGTH = struct.Struct("<q")

# Rank 0's reading of each DCP directory's ``.metadata`` (by directory), for the tables.
ReadItems = Callable[[Decision], Mapping[str, Sequence[StoredItem]]]


@dataclass(frozen=True)
class Received:
    """What this rank holds of the decision."""

    # Its objects: this node's rows on a node's first rank, none on the others, all where the
    # table is not split (and on rank 0, which read them).
    decision: Decision
    # The checkpoint's number of objects, wherever its rows are.
    objects: int
    # This rank restores for its node (else it waits for the rank that does).
    restores: bool


def per_node(dist: Any, node: NodeRanks) -> int | None:
    """The ranks per node when every rank's node is known and the nodes are aligned blocks of
    one size (a collective: one all-reduce MAX of three integers), else None."""
    size = len(node.ranks)
    odd = int(not node.known or node.ranks.start % size != 0)
    most, least, bad = all_reduce_ints(dist, [size, -size, odd], "max")
    return None if bad or most != -least else most


def share_decision(
    dist: Any, decision: Decision | None, *, rank: int, node: NodeRanks, read_items: ReadItems
) -> Received:
    """Rank 0's ``decision`` on every rank, its table on the node leaders only (a collective:
    every rank calls it; see the module docstring)."""
    world = int(dist.get_world_size())
    block = per_node(dist, node)
    if rank != 0:
        shared, count, pad = decode(broadcast_bytes(dist, None))
        if not pad:
            return Received(shared, count, True)
        if rank != node.ranks.start:
            return Received(shared, count, False)
        table = _receive(dist, pad)
        return Received(replace(shared, objects=rows_from_bytes(shared.point, table)), count, True)
    assert decision is not None
    point = decision.point
    tables: list[bytes] = []
    pad = 0
    if block and point is not None and decision.objects and point.world_size == world:
        if block < world:
            rows = node_rows(
                decision.objects, per_node=block, world_size=world, dcp=read_items(decision)
            )
            tables = [rows_to_bytes(point, [decision.objects[i] for i in r]) for r in rows]
            pad = _LENGTH.size + max(len(t) for t in tables[1:])
        else:
            pad = 1  # one node: its first rank (this one) holds every row already
    broadcast_bytes(dist, to_bytes(decision, rows=not pad, split=pad))
    _send(dist, tables[1:], block or world, pad)
    return Received(decision, len(decision.objects), True)


def _send(dist: Any, tables: Sequence[bytes], block: int, pad: int) -> None:
    import torch

    device = collective_device(dist)
    for first in range(0, len(tables), SEND_BATCH):
        ops = []
        for node, table in enumerate(tables[first : first + SEND_BATCH], start=first + 1):
            framed = bytearray(_LENGTH.pack(len(table)) + table)
            framed += bytes(pad - len(framed))
            tensor = torch.frombuffer(framed, dtype=torch.uint8).to(device)
            ops.append(dist.P2POp(dist.isend, tensor, node * block))
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _receive(dist: Any, pad: int) -> bytes:
    import torch

    tensor = torch.empty(pad, dtype=torch.uint8, device=collective_device(dist))
    for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensor, 0)]):
        work.wait()
    framed = tensor.cpu().numpy().tobytes()
    (length,) = _LENGTH.unpack_from(framed)
    return framed[_LENGTH.size : _LENGTH.size + length]
