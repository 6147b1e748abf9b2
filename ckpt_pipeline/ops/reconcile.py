"""``ckpt-pipeline reconcile``: the checkpoint store beside the database, both ways.

* **Unreported**: a checkpoint in the store (grouped by :mod:`ckpt_pipeline.ops.reconcile_layout`)
  with no ``training_checkpoints`` row for its step: the damage of a job that saved and died
  before its report reached the database, or of a reporter that never ran.
* **Differs**: a row of the job whose objects (in this store) are missing or not as reported,
  checked exactly as a resume checks them (``trainer_client.storage.verify``), from the
  store's own listing (one pass serves both; HEADs only for what a listing cannot decide).
* **Partial**: a checkpoint with rows whose layout names a rank (its objects in the store) that
  has no row of the checkpoint's attempt: a rank that wrote its part and died before its report
  reached the database (its spool lost with the node). The checkpoint stays incomplete until
  that rank's report arrives.
* **Pruned**: a checkpoint in the store with no row but a tombstone (``prune`` removed its rows;
  ``--delete-objects`` was not asked or not possible): listed, never counted as damage and never
  backfilled (the writer would drop the reports on the tombstone anyway).
* **In flight**: an unreported checkpoint written less than ``min_age_s`` ago, or with a
  multipart upload still open under it (ListMultipartUploads), is listed apart and never
  backfilled: its reports may be on their way. An incomplete DCP directory (no ``.metadata``)
  likewise: it is not a checkpoint.

``--backfill`` reports each unreported checkpoint, and each partial one's missing ranks, through
the normal queue path: ``ckpt.v1`` reports sent to the pipeline's queue with the contract's own
dedup and group ids, so the writer stores them as any other. Idempotent: the reports of one
checkpoint are always the same identities (run attempt ``run_attempt``, default 0, for an
unreported checkpoint; the rows' own attempt for a partial one), so a second run is dropped by
SQS within 5 minutes and is a no-op in the writer after that. Each is marked
``extra.backfilled = true`` (with the layout) and pins every object as the store answers now.
One report per rank of the world size the layout names (``reconcile_layout``: the Trainer's
``rng_state_<rank>.pth``, DCP's shards, DeepSpeed's partitions, rank files), each with that
rank's objects; a layout that names none (a Lightning file, a plain directory) is backfilled only
with ``--world-size`` (every rank then reports the whole checkpoint, as the Lightning
integration's ranks report its one file), and never when it names another. A partial
checkpoint whose layout names another world size than its rows is listed, never backfilled.
Nothing is ever deleted; without ``--backfill`` nothing is sent.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.ops.reconcile_findings import (
    Backfill,
    Disagreement,
    Reconciliation,
    in_flight,
    unreported_ranks,
    world_size_of,
)
from ckpt_pipeline.ops.reconcile_layout import (
    StoreObject,
    group_checkpoints,
)
from ckpt_pipeline.sdk_errors import POSTGRESQL, S3, calling
from trainer_client.storage.uri import (
    CheckpointUri,
    spread_of,
    spread_segments,
    spread_width,
    unspread_uri,
)
from trainer_client.storage.verify import (
    LIST_PAGE,
    LIST_WORKERS,
    Listed,
    ShardRecord,
    StoreListing,
    expectations,
    list_spread,
    verify_objects,
)

_ROWS = """
SELECT c.step, c.world_size, c.run_attempt, s.rank, s.uri, s.size_bytes, s.sha256,
       coalesce(s.objects, s.extra->'objects'), s.extra
FROM training_checkpoints c
LEFT JOIN training_checkpoint_shards s
  ON s.job_id = c.job_id AND s.step = c.step AND s.run_attempt = c.run_attempt
WHERE c.job_id = %s
ORDER BY c.step, s.rank
"""


@dataclass(frozen=True)
class Store:
    """``s3://bucket/prefix`` or ``file:///dir``, parsed."""

    uri: str
    scheme: str
    bucket: str
    prefix: str
    # The hex digits of the spread its objects were uploaded with (``UploadSettings.
    # spread_prefixes``, storage/uri.py): every ``<hex>/prefix`` belongs to the store too.
    spread_width: int = 0

    @classmethod
    def parse(cls, uri: str) -> Store:
        parsed = CheckpointUri.parse(uri)
        if parsed.scheme == "s3" and parsed.bucket:
            prefix = parsed.key
            prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
            return cls(f"s3://{parsed.bucket}/{prefix}", "s3", parsed.bucket, prefix)
        if parsed.scheme == "file" and parsed.is_local_host and parsed.path:
            directory = parsed.decoded_path.rstrip("/") + "/"
            return cls(Path(directory).as_uri() + "/", "file", "", directory)
        raise ConfigError("--store", "must be s3://bucket[/prefix] or file:///dir")

    def contains(self, uri: str) -> bool:
        if self.spread_width and not uri.startswith(self.uri):
            uri = unspread_uri(uri, self.spread_width) or uri
        return uri.startswith(self.uri) or uri.rstrip("/") + "/" == self.uri

    def spread_in(self, uris: Iterable[str]) -> int:
        """The hex digits of the spread the first of ``uris`` in a spread form of this store
        was uploaded with (0: none is)."""
        if self.scheme != "s3" or not self.prefix:
            return 0  # at a bucket's root every key's first segment could be a spread's
        head = f"s3://{self.bucket}/"
        for uri in uris:
            if uri.startswith(head) and not uri.startswith(self.uri):
                width = spread_of(uri[len(head) :], self.prefix)
                if width:
                    return width
        return 0


# -- listing the store ---------------------------------------------------------------------------


def list_store(
    store: Store, s3: Any, *, expected: Iterable[str] = (), workers: int = LIST_WORKERS
) -> tuple[list[StoreObject], set[str], StoreListing | None]:
    """Every object under the store, the keys of multipart uploads still open, and (on S3) the
    same listing as the verification reads it: one pass serves both. On S3 the pass is cut at
    every 1,000th of the ``expected`` URIs (the rows' objects) into ranges listed concurrently
    (``list_prefix``): about one request per 1,000 objects, ``workers`` at a time."""
    if store.scheme == "file":
        return _list_directory(store), set(), None
    objects: list[StoreObject] = []
    listed: dict[str, Listed] = {}
    head = f"s3://{store.bucket}/"
    keys = sorted({u[len(head) :] for u in expected if store.contains(u) and u.startswith(head)})
    items = list_spread(
        s3, store.bucket, store.prefix, width=store.spread_width,
        split_after=keys[LIST_PAGE - 1 :: LIST_PAGE], workers=workers,
    )  # fmt: skip
    for unspread, item in items:
        key = item["Key"]
        uri = head + key
        objects.append(
            StoreObject(
                unspread[len(store.prefix) :],
                uri,
                int(item["Size"]),
                item["LastModified"].timestamp(),
            )
        )
        listed[uri] = Listed(
            key,
            int(item["Size"]),
            item.get("ETag"),
            None,
            tuple(item.get("ChecksumAlgorithm") or ()),
            item.get("ChecksumType"),
        )
    segments = spread_segments(store.spread_width)
    prefixes = [store.prefix] + [f"{segment}/{store.prefix}" for segment in segments]
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(prefixes)))) as pool:
        open_uploads = pool.map(lambda p: (p, _open_uploads(s3, store.bucket, p)), prefixes)
        uploading = {key[len(p) :] for p, keys in open_uploads for key in keys}
    return objects, uploading, StoreListing(store.uri, listed, store.spread_width)


def _open_uploads(s3: Any, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
    return [u["Key"] for page in pages for u in page.get("Uploads", [])]


def _list_directory(store: Store) -> list[StoreObject]:
    root = Path(store.prefix)
    if not root.is_dir():
        raise ConfigError("--store", f"{root} is not a directory")
    objects = []
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            stat = path.stat()
            relative = path.relative_to(root).as_posix()
            objects.append(StoreObject(relative, path.as_uri(), stat.st_size, stat.st_mtime))
    return objects


# -- the database --------------------------------------------------------------------------------


def read_rows(
    database_url: str, job_id: str
) -> tuple[dict[int, list[ShardRecord]], dict[int, tuple[int, int]], set[int]]:
    """The job's checkpoints, each with the shard rows of its attempt; each one's (run_attempt,
    world_size); and its pruned steps."""
    import psycopg

    rows: dict[int, list[ShardRecord]] = {}
    heads: dict[int, tuple[int, int]] = {}
    with psycopg.connect(database_url, prepare_threshold=None, connect_timeout=5) as conn:
        conn.read_only = True
        for step, world, attempt, rank, uri, size, sha, objects, extra in conn.execute(
            _ROWS, (job_id,)
        ):
            heads[int(step)] = (int(attempt), int(world))
            shards = rows.setdefault(int(step), [])
            if rank is not None:
                shards.append(ShardRecord(rank, uri, size, sha, objects, extra or {}))
        pruned = {
            int(step)
            for (step,) in conn.execute(
                "SELECT step FROM training_checkpoint_tombstones WHERE job_id = %s", (job_id,)
            )
        }
    return rows, heads, pruned


def _all(rows: dict[int, list[ShardRecord]]) -> Iterable[ShardRecord]:
    return (shard for shards in rows.values() for shard in shards)


# -- comparing -----------------------------------------------------------------------------------


def reconcile(
    *,
    job_id: str,
    store: Store,
    database_url: str,
    s3: Any = None,
    pattern: re.Pattern[str] | None = None,
    min_age_s: float = 900.0,
    now_s: float | None = None,
    world_size: int | None = None,
    spread_prefixes: int | None = None,
) -> tuple[Reconciliation, list[Backfill]]:
    """Compare; returns the findings and what ``--backfill`` would report.

    The rows are read first: every object a row names was written before the listing starts,
    so the listing shows it (an object reported meanwhile is at most listed as in flight).
    ``world_size``: ``--world-size``, for layouts that name none. ``spread_prefixes``:
    ``--spread-prefixes``, the upload's spread (every ``<hex>/prefix`` is listed too); None:
    the spread of the rows' objects, if any (none when no row names a spread object)."""
    with calling(POSTGRESQL, "DATABASE_URL"):
        rows, heads, pruned = read_rows(database_url, job_id)
    if spread_prefixes is not None:
        store = replace(store, spread_width=spread_width(spread_prefixes))
    elif store.scheme == "s3":
        uris = (o.get("uri", "") for s in _all(rows) for o in (s.objects or []))
        store = replace(store, spread_width=store.spread_in(uris))
    expected = {
        step: expectations([s for s in shards if store.contains(s.uri)])
        for step, shards in rows.items()
    }
    with calling(S3, f"--store {store.uri}"):
        objects, uploading, listing = list_store(
            store, s3, expected=(e.uri for items in expected.values() for e in items)
        )
    checkpoints = group_checkpoints(objects, pattern=pattern)
    result = Reconciliation(job_id, store.uri, in_store=len(checkpoints))
    now = time.time() if now_s is None else now_s

    backfills: list[Backfill] = []
    for checkpoint in checkpoints:
        where = store.uri + checkpoint.location
        world = world_size_of(checkpoint, world_size)
        if checkpoint.step in rows:
            result.with_rows += 1
            if not any(store.contains(r.uri) for r in rows[checkpoint.step]):
                continue  # its rows name another store's objects
            attempt, recorded = heads[checkpoint.step]
            found = unreported_ranks(checkpoint, rows[checkpoint.step], recorded, world)
            if found is None:
                continue
            missing, why_not = found
            parts = [o for r in missing for o in checkpoint.ranks.get(r, [])]
            reason = in_flight(checkpoint, parts, uploading, now_s=now, min_age_s=min_age_s)
            if reason:
                result.findings.append(Disagreement("in-flight", checkpoint.step, where, reason))
                continue
            detail = (
                f"rank {', '.join(map(str, missing)) or '-'} of {recorded} with no row of"
                f" attempt {attempt}: {len(parts)} objects, {sum(o.bytes for o in parts)} B"
            )
            launches = {r.extra.get("launch_id") for r in rows[checkpoint.step]}
            if len(launches) > 1:
                why_not = why_not or f"its rows carry {len(launches)} launch ids"
            if why_not:
                detail += f"; not backfilled: {why_not}"
            else:
                (launch,) = launches
                backfills.append(
                    Backfill(checkpoint, tuple(missing), recorded, attempt, launch or None)
                )
            result.findings.append(
                Disagreement(
                    "partial",
                    checkpoint.step,
                    where,
                    detail,
                    checkpoint.layout,
                    0 if why_not else len(missing),
                )
            )
            continue
        if checkpoint.step in pruned:
            detail = "no row: removed by prune (a tombstone); its objects are still in the store"
            result.findings.append(Disagreement("pruned", checkpoint.step, where, detail))
            continue
        reason = in_flight(
            checkpoint, checkpoint.objects, uploading, now_s=now, min_age_s=min_age_s
        )
        if reason:
            result.findings.append(Disagreement("in-flight", checkpoint.step, where, reason))
            continue
        detail = f"{len(checkpoint.objects)} objects, {checkpoint.bytes} B, no row"
        if isinstance(world, str):
            detail += f"; not backfilled: {world}"
            reports = 0
        else:
            reports = world
            backfills.append(Backfill(checkpoint, tuple(range(world)), world))
        result.findings.append(
            Disagreement("unreported", checkpoint.step, where, detail, checkpoint.layout, reports)
        )
    for step, shards in sorted(rows.items()):
        mine = [s for s in shards if store.contains(s.uri)]
        if not mine:
            if shards:
                result.rows_elsewhere += 1
                result.elsewhere_example = result.elsewhere_example or shards[0].uri
            continue
        # The store's listing decides what it can (no second listing); HEADs for the rest.
        with calling(S3, f"--store {store.uri}"):
            verified = verify_objects(
                expected[step], s3_client=s3, stop_at_first=False, listing=listing
            )
        if not verified.intact:
            where = mine[0].uri
            result.findings.append(Disagreement("differs", step, where, verified.summary()))
    result.findings.sort(key=lambda f: (f.step, f.kind))
    return result, backfills
