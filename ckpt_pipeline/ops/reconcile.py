"""``ckpt-pipeline reconcile``: the checkpoint store beside the database, both ways.

* **Unreported**: a checkpoint in the store (grouped by :mod:`ckpt_pipeline.ops.reconcile_layout`)
  with no ``training_checkpoints`` row for its step: the damage of a job that saved and died
  before its report reached the database, or of a reporter that never ran.
* **Differs**: a row of the job whose objects (in this store) are missing or not as reported,
  checked exactly as a resume checks them (``trainer_client.storage.verify``), from the
  store's own listing (one pass serves both; HEADs only for what a listing cannot decide).
* **Pruned**: a checkpoint in the store with no row but a tombstone (``prune`` removed its rows;
  ``--delete-objects`` was not asked or not possible): listed, never counted as damage and never
  backfilled (the writer would drop the reports on the tombstone anyway).
* **In flight**: an unreported checkpoint written less than ``min_age_s`` ago, or with a
  multipart upload still open under it (ListMultipartUploads), is listed apart and never
  backfilled: its reports may be on their way. An incomplete DCP directory (no ``.metadata``)
  likewise: it is not a checkpoint.

``--backfill`` reports each unreported checkpoint through the normal queue path: ``ckpt.v1``
reports sent to the pipeline's queue with the contract's own dedup and group ids, so the writer
stores them as any other. Idempotent: the reports of one checkpoint are always the same
identities (run attempt ``run_attempt``, default 0), so a second run is dropped by SQS within
5 minutes and is a no-op in the writer after that. Each is marked ``extra.backfilled = true``
(with the layout) and pins every object as the store answers now. One report per rank where
the layout has ranks (DCP, one object per rank); otherwise one report (world size 1) for the
whole checkpoint. Nothing is ever deleted; without ``--backfill`` nothing is sent.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ckpt_pipeline.exceptions import ConfigError
from ckpt_pipeline.ops.reconcile_layout import (
    StoreCheckpoint,
    StoreObject,
    group_checkpoints,
)
from ckpt_pipeline.sdk_errors import POSTGRESQL, S3, calling
from trainer_client.storage.uri import CheckpointUri
from trainer_client.storage.verify import (
    LIST_PAGE,
    LIST_WORKERS,
    Listed,
    ShardRecord,
    StoreListing,
    expectations,
    list_prefix,
    verify_objects,
)

_ROWS = """
SELECT c.step, c.world_size, c.is_complete, s.rank, s.uri, s.size_bytes, s.sha256,
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
        return uri.startswith(self.uri) or uri.rstrip("/") + "/" == self.uri


@dataclass
class Disagreement:
    """One checkpoint that the store and the database disagree about."""

    kind: str  # "unreported", "differs", "in-flight", "pruned"
    step: int
    where: str
    detail: str
    layout: str | None = None
    reports: int = 0


@dataclass
class Reconciliation:
    """Everything one run found, and what it sent."""

    job_id: str
    store: str
    in_store: int = 0
    with_rows: int = 0
    rows_elsewhere: int = 0
    # One object URI of a row elsewhere: where the job's checkpoints are, for a mistyped --store.
    elsewhere_example: str = ""
    findings: list[Disagreement] = field(default_factory=list)
    backfilled: int = 0
    dry_run: bool = True

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f.kind == kind)

    def summary(self) -> str:
        sent = f"backfilled {self.backfilled} reports" if not self.dry_run else "dry run"
        return (
            f"reconcile job {self.job_id} store {self.store}: {self.in_store} checkpoints in the"
            f" store, {self.with_rows} with rows; {self.count('unreported')} unreported,"
            f" {self.count('differs')} differing, {self.count('in-flight')} in flight,"
            f" {self.count('pruned')} pruned,"
            f" {self.rows_elsewhere} rows elsewhere; {sent}"
        )

    def as_json(self) -> str:
        return json.dumps({**asdict(self), "summary": self.summary()}, indent=2)


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
    keys = sorted({u[len(head) :] for u in expected if u.startswith(store.uri)})
    items = list_prefix(
        s3, store.bucket, store.prefix, split_after=keys[LIST_PAGE - 1 :: LIST_PAGE],
        workers=workers,
    )  # fmt: skip
    for item in items:
        key = item["Key"]
        uri = head + key
        objects.append(
            StoreObject(
                key[len(store.prefix) :],
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
    uploading: set[str] = set()
    for page in s3.get_paginator("list_multipart_uploads").paginate(
        Bucket=store.bucket, Prefix=store.prefix
    ):
        uploading.update(u["Key"][len(store.prefix) :] for u in page.get("Uploads", []))
    return objects, uploading, StoreListing(store.uri, listed)


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


def read_rows(database_url: str, job_id: str) -> tuple[dict[int, list[ShardRecord]], set[int]]:
    """The job's checkpoints, each with the shard rows of its attempt; and its pruned steps."""
    import psycopg

    rows: dict[int, list[ShardRecord]] = {}
    with psycopg.connect(database_url, prepare_threshold=None, connect_timeout=5) as conn:
        conn.read_only = True
        for step, _world, _complete, rank, uri, size, sha, objects, extra in conn.execute(
            _ROWS, (job_id,)
        ):
            shards = rows.setdefault(int(step), [])
            if rank is not None:
                shards.append(ShardRecord(rank, uri, size, sha, objects, extra or {}))
        pruned = {
            int(step)
            for (step,) in conn.execute(
                "SELECT step FROM training_checkpoint_tombstones WHERE job_id = %s", (job_id,)
            )
        }
    return rows, pruned


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
) -> tuple[Reconciliation, list[StoreCheckpoint]]:
    """Compare; returns the findings and the unreported checkpoints that may be backfilled.

    The rows are read first: every object a row names was written before the listing starts,
    so the listing shows it (an object reported meanwhile is at most listed as in flight)."""
    with calling(POSTGRESQL, "DATABASE_URL"):
        rows, pruned = read_rows(database_url, job_id)
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
    backfillable: list[StoreCheckpoint] = []
    for checkpoint in checkpoints:
        where = store.uri + checkpoint.location
        if checkpoint.step in rows:
            result.with_rows += 1
            continue
        if checkpoint.step in pruned:
            detail = "no row: removed by prune (a tombstone); its objects are still in the store"
            result.findings.append(Disagreement("pruned", checkpoint.step, where, detail))
            continue
        busy = [k for k in uploading if k.startswith(checkpoint.location)]
        if checkpoint.layout == "incomplete-dcp":
            reason = "DCP directory without .metadata (not a checkpoint yet)"
        elif checkpoint.layout == "incomplete-hf":
            reason = "checkpoint directory without trainer_state.json (not a checkpoint yet)"
        elif busy:
            reason = f"multipart upload open for {busy[0]}"
        elif now - checkpoint.newest_modified_s < min_age_s:
            reason = f"written {now - checkpoint.newest_modified_s:.0f} s ago (< --min-age)"
        else:
            reason = ""
        if reason:
            result.findings.append(Disagreement("in-flight", checkpoint.step, where, reason))
            continue
        reports = len(checkpoint.ranks) or 1
        detail = f"{len(checkpoint.objects)} objects, {checkpoint.bytes} B, no row"
        result.findings.append(
            Disagreement("unreported", checkpoint.step, where, detail, checkpoint.layout, reports)
        )
        backfillable.append(checkpoint)
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
    return result, backfillable
