"""The restart's decision as the bytes rank 0 broadcasts once (zlib over compact JSON).

Compact where it grows: the ranks' URIs as runs of ranks that share one (a DCP checkpoint's ranks
all name its directory: one run), the objects as rows of (name below the checkpoint, size,
SHA-256, version id, ETag) whose URI is the checkpoint's location joined with the name (for an
upload spread over prefixes, that URI's spread form: the row adds the spread's width, not the URI).
Everything else is a few bounded fields. No pickle: a rank never unpickles what another sent.

The rows can travel apart from the rest (the header): :func:`to_bytes` with ``rows=False`` leaves
them out and says how many objects the checkpoint has and the ranks per node the table is split
by (``split``); :func:`rows_to_bytes` encodes one node's rows (:mod:`.wire_table`).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from ckpt_contract.restart import SkippedCandidate
from trainer_client.report.launch import Launch
from trainer_client.restart.decide import Decision
from trainer_client.restart.lookup import ResumePoint
from trainer_client.storage.restore import RemoteObject
from trainer_client.storage.uri import CheckpointUri, spread_key, spread_of


def _runs(uris: Mapping[int, str]) -> list[list[Any]]:
    runs: list[list[Any]] = []
    for rank in sorted(uris):
        uri = uris[rank]
        if runs and runs[-1][0] == uri and runs[-1][2] == rank - 1:
            runs[-1][2] = rank
        else:
            runs.append([uri, rank, rank])
    return runs


def _object_uri(root: str, relative: str, spread: int = 0) -> str:
    uri = root if not relative else root.rstrip("/") + "/" + relative
    if not spread:
        return uri
    parsed = CheckpointUri.parse(uri)
    return parsed.with_path("/" + spread_key(parsed.key, 16**spread))


def _row(point: ResumePoint | None, o: RemoteObject) -> list[Any]:
    """An object's row: its URI left out where the checkpoint's location and its name give it,
    or (uploaded spread, ``<hex>/…``) they and the spread's width do."""
    row: list[Any] = [o.relative, o.bytes, o.sha256, o.version_id, o.etag]
    if point is None:
        return [*row, o.uri]
    root = point.path
    if o.uri == _object_uri(root, o.relative):
        return row
    width = spread_of(CheckpointUri.parse(o.uri).key, CheckpointUri.parse(root).key)
    return [*row, width if width and o.uri == _object_uri(root, o.relative, width) else o.uri]


def _object(point: ResumePoint | None, row: list[Any]) -> RemoteObject:
    if len(row) > 5 and isinstance(row[5], str):
        uri = row[5]
    else:
        spread = row[5] if len(row) > 5 else 0
        uri = _object_uri(point.path if point else "", row[0], spread)
    return RemoteObject(uri, row[0], row[1], row[2], row[3], row[4])


def rows_to_bytes(point: ResumePoint | None, objects: Sequence[RemoteObject]) -> bytes:
    """Some of the decision's objects, in the rows' wire form."""
    body = [_row(point, o) for o in objects]
    return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 6)


def rows_from_bytes(point: ResumePoint | None, data: bytes) -> tuple[RemoteObject, ...]:
    """The objects :func:`rows_to_bytes` encoded."""
    return tuple(_object(point, row) for row in json.loads(zlib.decompress(data)))


def to_bytes(decision: Decision, *, rows: bool = True, split: int = 0) -> bytes:
    """The decision's wire form; without its rows (``rows=False``) the header, whose ``split``
    says the ranks per node whose leaders receive the table (0: the rows are in it)."""
    point = decision.point
    launch = decision.launch
    body: dict[str, Any] = {
        "p": None
        if point is None
        else [
            point.job_id,
            point.step,
            point.epoch,
            point.run_attempt,
            point.world_size,
            point.path,
            _runs(point.uris),
        ],
        "o": [_row(point, o) for o in decision.objects] if rows else [],
        "oc": len(decision.objects),
        "sp": split,
        "u": decision.uploaded_from,
        "e": decision.error,
        "l": None if launch is None else [launch.run_attempt, launch.launch_id, launch.how],
        "s": [c.model_dump(mode="json") for c in decision.skipped],
        "n": decision.newest_step,
        "r": list(decision.same_step_restarts),
        "b": decision.stepped_back_from,
        "w": [list(x) for x in decision.unwritten],
        "wc": decision.unwritten_count,
        "sn": None if decision.store_newer is None else list(decision.store_newer),
    }
    return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 6)


def from_bytes(data: bytes) -> Decision:
    """The decision :func:`to_bytes` encoded."""
    return header_from_bytes(data)[0]


def header_from_bytes(data: bytes) -> tuple[Decision, int, int]:
    """The decision :func:`to_bytes` encoded (its rows, if it carries them), the checkpoint's
    number of objects and the ranks per node the table is split by (0: not split)."""
    body = json.loads(zlib.decompress(data))
    point = None
    if body["p"] is not None:
        job_id, step, epoch, attempt, world, path, runs = body["p"]
        uris = {rank: uri for uri, first, last in runs for rank in range(first, last + 1)}
        point = ResumePoint(job_id, step, epoch, attempt, world, uris, path)
    objects = tuple(_object(point, row) for row in body["o"])
    launch = None if body["l"] is None else Launch(*body["l"])
    decision = Decision(
        point,
        objects,
        body["u"],
        body["e"],
        launch,
        tuple(SkippedCandidate.model_validate(c) for c in body["s"]),
        body["n"],
        tuple(body["r"]),
        body["b"],
        tuple((s, a, r) for s, a, r in body["w"]),
        None if body["sn"] is None else (body["sn"][0], body["sn"][1]),
        body["wc"],
    )
    return decision, body["oc"], body["sp"]
