"""This node's share of a checkpoint in S3: read each DCP directory's ``.metadata`` first
(verified, once per node), then name what the node's ranks load
(:mod:`trainer_client.restart.node_share`), for the restart's one restore.

``.metadata`` is read from the destination when an earlier restore left it there with its
reported SHA-256, else restored (verified, atomic, under the node's lock, like every restore) into
a hidden directory beside the destination, ``.<name>.metadata/``, which the node's other ranks
then find; its bytes go on to the restore as ``preloaded``, so it is fetched once per node.
Under torchrun, rank 0 reads it once for the job and the other nodes' leaders take it from the
relay (:mod:`trainer_client.restart.relay`): ``read`` hands that reading in.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_client.config import torchrun_node
from trainer_client.restart.node_share import (
    NodeRanks,
    NodeShare,
    StoredItem,
    dcp_directories,
    node_share,
    stored_items,
)
from trainer_client.storage.committed import DCP_METADATA
from trainer_client.storage.durable import sha256_file
from trainer_client.storage.restore import RemoteObject, restore

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeFetch:
    """The node's share, the ``.metadata`` bytes read, and the bytes fetched to read them."""

    share: NodeShare
    preloaded: Mapping[str, bytes] = field(default_factory=dict)
    fetched_bytes: int = 0
    # The items each DCP directory's ``.metadata`` lists (by directory, "" for the root).
    dcp: Mapping[str, Sequence[StoredItem]] = field(default_factory=dict)


def this_node(dist: Any) -> NodeRanks:
    """This process's node: torchrun's ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` with the process
    group's rank and size; every rank of the job without a process group (each process then
    restores alone, so it takes everything)."""
    if dist is None:
        return NodeRanks(range(1), 1)
    local_rank, local_world_size = torchrun_node()
    return NodeRanks.of(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=local_world_size,
    )


def metadata_dir(dest: Path) -> Path:
    """Where the node keeps the ``.metadata`` files it read before restoring ``dest``."""
    return dest.parent / f".{dest.name}.metadata"


def read_metadata(
    objects: Sequence[RemoteObject], dest: Path, *, client: Any, max_workers: int
) -> NodeFetch:
    """Every DCP directory's ``.metadata`` among ``objects``, read (see the module docstring);
    the share is left empty."""
    wanted = {f"{d}/{DCP_METADATA}" if d else DCP_METADATA: d for d in dcp_directories(objects)}
    metas = [o for o in objects if o.relative in wanted]
    preloaded: dict[str, bytes] = {}
    fetched = 0
    missing = []
    for meta in metas:
        local = dest / meta.relative
        if meta.sha256 is not None and local.is_file() and sha256_file(local) == meta.sha256:
            preloaded[meta.relative] = local.read_bytes()
        else:
            missing.append(meta)
    if missing:
        side = restore(missing, metadata_dir(dest), client=client, max_workers=max_workers)
        fetched = side.fetched_bytes
        for meta in missing:
            preloaded[meta.relative] = (side.path / meta.relative).read_bytes()
    dcp: dict[str, list[StoredItem]] = {}
    for relative, data in preloaded.items():
        # The bytes were verified against the reports (size, SHA-256, pinned version): the
        # same trust as dcp.load's own pickle.load of this file.
        dcp[wanted[relative]] = stored_items(pickle.loads(data))
    return NodeFetch(NodeShare(()), preloaded, fetched, dcp)


def fetch_for_node(
    objects: Sequence[RemoteObject],
    dest: Path,
    *,
    node: NodeRanks,
    saved_world_size: int,
    client: Any,
    max_workers: int,
    read: NodeFetch | None = None,
) -> NodeFetch:
    """What ``node`` restores of ``objects`` into ``dest`` (see the module docstring); ``read``:
    the ``.metadata`` this process already read (:func:`read_metadata`)."""
    if node.world_size != saved_world_size or len(node.ranks) == node.world_size:
        share = node_share(objects, node=node, saved_world_size=saved_world_size, dcp={})
        return NodeFetch(share)
    if read is None:
        read = read_metadata(objects, dest, client=client, max_workers=max_workers)
    share = node_share(objects, node=node, saved_world_size=saved_world_size, dcp=read.dcp)
    _log.debug(
        "node of ranks %s: %d of %d objects, %d in part",
        node.ranks,
        len(share.objects),
        len(objects),
        len(share.ranges),
    )
    return NodeFetch(share, read.preloaded, read.fetched_bytes)
