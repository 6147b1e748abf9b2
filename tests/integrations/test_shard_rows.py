"""The resume walk's shard rows read as a few aggregated texts (trainer_client/integrations/
shard_rows.py), from the checkpoint's manifest (migration 0013) or from its shard rows: the same
records as one row per shard, whatever the rows hold, and never a manifest gone stale."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from lambda_writer.writer.planning import BatchPlan, CheckpointUpsert, ShardRow
from lambda_writer.writer.repository import write_batch
from trainer_client.restart.lookup import latest_complete_checkpoint
from trainer_client.restart.shard_rows import SHARD_ROWS, RankUris, ShardRows
from trainer_client.restart.walk import _BIGINT_MAX, _LATEST_COMPLETE, complete_checkpoints
from trainer_client.storage.verify import ShardRecord

PIN = {"uri": "s3://b/job/step-1/__0_0.distcp", "bytes": 16, "etag": '"e0"'}
LEGACY_PIN = {"uri": "s3://b/job/step-1/__3_0.distcp", "bytes": 7, "version_id": "v,1"}
SHA = "ab" * 32

# rank -> (uri, size_bytes, sha256, objects, extra): every way a row can hold its pins and its
# extras.
ROWS: dict[int, tuple[Any, ...]] = {
    # pinned, and an extra the restart reads
    0: ("s3://b/job/step-1/", 16, None, [PIN], {"uploaded_from": "file:///x"}),
    # no pins: the URI is the object, with its size and SHA-256
    1: ("s3://b/job/step-1/rank-1.pt", 5, SHA, None, {}),
    # the files of a directory (the Hugging Face callback), a comma and quotes in the extra
    2: ("s3://b/job/step-1/", None, None, None, {"files": ["a,b.bin", 'q"uote']}),
    # a comma in a pin, and a previous release's writer's extra->'objects'
    3: ("s3://b/job/step-1/", 7, None, [LEGACY_PIN], {}),
    4: ("s3://b/job/step-1/", 7, None, None, {"objects": [LEGACY_PIN]}),
}


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)  # None: SQL NULL, not JSON null


def _fill(conn: Any, step: int, rows: dict[int, tuple[Any, ...]], *, complete: bool) -> None:
    conn.execute(
        "INSERT INTO training_checkpoints (job_id, step, epoch, run_attempt, world_size,"
        " shards_present, is_complete, first_reported_at) VALUES ('rows', %s, 0, 1, %s, %s, %s,"
        " now())",
        (step, len(rows), len(rows), complete),
    )
    for rank, (uri, size, sha, objects, extra) in rows.items():
        conn.execute(
            "INSERT INTO training_checkpoint_shards (job_id, step, rank, run_attempt, epoch,"
            " world_size, uri, size_bytes, sha256, objects, extra, reported_at)"
            " VALUES ('rows', %s, %s, 1, 0, %s, %s, %s, %s, %s::jsonb, %s::jsonb, now())",
            (step, rank, len(rows), uri, size, sha, _json(objects), json.dumps(extra)),
        )
    # a superseded row of an older attempt, which no read may return
    conn.execute(
        "INSERT INTO training_checkpoint_shards (job_id, step, rank, run_attempt, epoch,"
        " world_size, uri, reported_at) VALUES ('rows', %s, %s, 0, 0, %s, 's3://old', now())",
        (step, len(rows), len(rows) + 1),
    )


def _expected(rows: dict[int, tuple[Any, ...]]) -> dict[int, ShardRecord]:
    return {
        rank: ShardRecord(
            rank, uri, size, sha, objects if objects is not None else extra.get("objects"), extra
        )
        for rank, (uri, size, sha, objects, extra) in rows.items()
    }


def _build_manifests(conn: Any, ranks_per_chunk: int | None) -> None:
    """What the writer's settle does when it marks a checkpoint complete (the fills here write
    rows, not through the writer), in chunks of ``ranks_per_chunk`` ranks; None: no manifest."""
    if ranks_per_chunk is not None:
        conn.execute(
            "SELECT ckpt_build_manifest(job_id, step, %s) FROM training_checkpoints"
            " WHERE job_id = 'rows'",
            (ranks_per_chunk,),
        )


# Without a manifest; with one as the settle builds it (one chunk here); in chunks of 2 ranks,
# so the texts of several chunks are joined (ranks 0 and 2 have extras, in different chunks).
MANIFESTS = pytest.mark.parametrize(
    "ranks_per_chunk", [None, 10_000, 2], ids=["shard rows", "manifest", "manifest in chunks"]
)


def _walk_reads_shard_rows(conn: Any, job: str) -> bool:
    """Whether the walk reads the newest complete checkpoint's shard rows: it has no manifest of
    its attempt and world size, whole (the walk's first statement returns none)."""
    rows = conn.execute(_LATEST_COMPLETE, {"job_id": job, "before": _BIGINT_MAX}).fetchall()
    return ShardRows.from_chunks([row[4:] for row in rows]) is None


def _one_per_row(conn: Any, job: str, step: int, attempt: int) -> dict[int, ShardRecord]:
    key = {"job_id": job, "step": step, "run_attempt": attempt}
    return ShardRows.from_rows(conn.execute(SHARD_ROWS, key).fetchall()).records


@pytest.fixture
def conn(clean_db: str) -> Any:
    with psycopg.connect(clean_db, autocommit=True) as connection:
        yield connection


@MANIFESTS
def test_the_aggregated_read_gives_the_rows_one_per_row_reads(
    conn: Any, ranks_per_chunk: int | None
) -> None:
    # GIVEN a complete checkpoint whose rows hold their pins in every way the tables allow, with
    # or without the manifest the settle builds
    _fill(conn, 100, ROWS, complete=True)
    _build_manifests(conn, ranks_per_chunk)
    assert _walk_reads_shard_rows(conn, "rows") is (ranks_per_chunk is None)
    # WHEN the walk reads it THEN it is one aggregated row (nothing decoded yet), and its
    # records are the rows, as one row per shard reads them
    ((step, epoch, attempt, world, shards),) = list(complete_checkpoints(conn, "rows"))
    assert (step, epoch, attempt, world) == (100, 0, 1, len(ROWS))
    assert isinstance(shards, ShardRows) and "records" not in vars(shards)
    assert shards.ranks_are(len(ROWS)) and not shards.ranks_are(len(ROWS) + 1)
    assert shards.one_uri is None
    assert dict(shards) == _expected(ROWS)
    key = {"job_id": "rows", "step": 100, "run_attempt": 1}
    assert ShardRows.from_rows(conn.execute(SHARD_ROWS, key).fetchall()).records == dict(shards)


def test_a_manifest_missing_a_chunk_is_not_read(conn: Any) -> None:
    # GIVEN a manifest in 3 chunks of which one is gone (cannot happen through the writer: a
    # build replaces them all, an invalidation deletes them all)
    _fill(conn, 100, ROWS, complete=True)
    _build_manifests(conn, 2)
    conn.execute("DELETE FROM training_checkpoint_manifests WHERE chunk = 1")
    # THEN the walk reads the shard rows, and gets them all
    assert _walk_reads_shard_rows(conn, "rows")
    ((_, _, _, _, shards),) = list(complete_checkpoints(conn, "rows"))
    assert dict(shards) == _expected(ROWS)


@MANIFESTS
def test_a_uri_with_a_newline_is_read_one_row_per_shard(
    conn: Any, ranks_per_chunk: int | None
) -> None:
    # GIVEN a row written by hand whose URI holds a newline, and another whose SHA-256 holds a
    # comma (the contract accepts neither; the texts could not carry them)
    for step, row in (
        (100, ("s3://b/job/a\nb.pt", 1, None, None, {})),
        (200, ("s3://b/job/c.pt", 1, "x,y", None, {})),
    ):
        _fill(conn, step, {0: row}, complete=True)
    _build_manifests(conn, ranks_per_chunk)
    # THEN the walk reads those checkpoints' rows one per row, and gets them as they are
    walked = {c[0]: c[4] for c in complete_checkpoints(conn, "rows")}
    assert all("records" in vars(rows) for rows in walked.values())  # read, not aggregated
    assert dict(walked[100]) == _expected({0: ("s3://b/job/a\nb.pt", 1, None, None, {})})
    assert walked[200][0].sha256 == "x,y"


def test_the_point_of_a_checkpoint_of_one_uri_decodes_nothing(clean_db: str, conn: Any) -> None:
    # GIVEN a complete checkpoint whose ranks all reported its directory (a DCP save), and an
    # older one of one file per rank
    same: dict[int, tuple[Any, ...]] = {
        r: ("s3://b/job/step-2/", 16, None, [PIN], {}) for r in range(3)
    }
    _fill(conn, 200, same, complete=True)
    files: dict[int, tuple[Any, ...]] = {
        r: (f"s3://b/job/step-1/__{r}_0.distcp", 16, None, None, {}) for r in range(3)
    }
    _fill(conn, 100, files, complete=True)
    # WHEN the helper names the newest THEN its path is that URI, its uris every rank's, and
    # a point pickles (a restart's decision crosses processes) as the mapping it stands for
    point = latest_complete_checkpoint("rows", database_url=clean_db, check_files=False)
    assert point is not None and point.path == "s3://b/job/step-2"
    assert isinstance(point.uris, RankUris)
    assert point.uris == {r: "s3://b/job/step-2/" for r in range(3)}
    assert pickle.loads(pickle.dumps(point)) == point
    # ... and the older one's path is the directory of its ranks' files
    ((_, _, _, _, shards),) = [c for c in complete_checkpoints(conn, "rows") if c[0] == 100]
    assert isinstance(shards, ShardRows)
    assert shards.one_uri is None and dict(shards.uris) == {r: files[r][0] for r in range(3)}


def test_a_checkpoint_without_shard_rows_is_no_candidate_point(clean_db: str, conn: Any) -> None:
    # GIVEN a complete checkpoint row whose shard rows are missing (cannot happen through the
    # writer) THEN the walk yields it with no rows, and the helper resumes from nothing
    conn.execute(
        "INSERT INTO training_checkpoints (job_id, step, epoch, run_attempt, world_size,"
        " shards_present, is_complete, first_reported_at) VALUES ('rows', 1, 0, 0, 2, 2, true,"
        " now())"
    )
    ((_, _, _, _, shards),) = list(complete_checkpoints(conn, "rows"))
    assert isinstance(shards, ShardRows)
    assert len(shards) == 0 and dict(shards) == {} and not shards.ranks_are(2)
    assert latest_complete_checkpoint("rows", database_url=clean_db, check_files=False) is None


# Reports through the real writer (its statement, its settle), one object pinned each.
AT = datetime(2026, 12, 6, tzinfo=UTC)


def _report(step: int, rank: int, *, attempt: int = 0, world: int = 3, etag: str = "e") -> ShardRow:
    uri = f"s3://b/w/step-{step}/__{rank}_0.distcp"
    pin = {"uri": uri, "bytes": 16, "etag": f'"{etag}{rank}"'}
    return ShardRow(
        job_id="w", step=step, rank=rank, run_attempt=attempt, epoch=1, world_size=world,
        uri=uri, loss=None, metrics_json="{}", size_bytes=16, sha256=None, extra_json="{}",
        sqs_message_id=f"m-{step}-{rank}-{attempt}", reported_at=AT,
        objects_json=json.dumps([pin]),
    )  # fmt: skip


def _write(url: str, *rows: ShardRow) -> None:
    newest = max(rows, key=lambda r: (r.run_attempt, r.world_size))
    upsert = CheckpointUpsert("w", newest.step, newest.run_attempt, 1, newest.world_size, AT)
    with psycopg.connect(url, autocommit=True) as writer:
        write_batch(
            writer, BatchPlan((upsert,), tuple(sorted(rows, key=lambda r: r.rank)), len(rows))
        )


def _etag(record: ShardRecord) -> Any:
    assert record.objects is not None
    return record.objects[0]["etag"]


def _newest(conn: Any) -> tuple[int, int, int, dict[int, ShardRecord]] | None:
    """The walk's first candidate as (step, attempt, world size, records), checked against the
    same checkpoint's rows read one per row."""
    found = next(complete_checkpoints(conn, "w"), None)
    if found is None:
        return None
    step, _, attempt, world, shards = found
    records = dict(shards)
    assert records == _one_per_row(conn, "w", step, attempt)
    return step, attempt, world, records


@pytest.fixture
def settled(clean_db: str, conn: Any) -> Any:
    # GIVEN a checkpoint of 3 ranks written through the writer, in two batches: the settle of
    # the second marks it complete and builds its manifest, which the walk reads alone
    _write(clean_db, _report(100, 0), _report(100, 1))
    assert conn.execute("SELECT count(*) FROM training_checkpoint_manifests").fetchone() == (0,)
    _write(clean_db, _report(100, 2))
    assert conn.execute(
        "SELECT step, run_attempt, world_size, shard_count FROM training_checkpoint_manifests"
    ).fetchall() == [(100, 0, 3, 3)]
    assert not _walk_reads_shard_rows(conn, "w")
    newest = _newest(conn)
    assert newest is not None and _etag(newest[3][2]) == '"e2"'
    return conn


def test_a_replayed_report_keeps_the_manifest(clean_db: str, settled: Any) -> None:
    # WHEN a report of the settled attempt is delivered again (its shard row stays as it was)
    _write(clean_db, _report(100, 1, etag="replayed"))
    # THEN the manifest is still read, and is what the rows hold
    assert not _walk_reads_shard_rows(settled, "w")
    newest = _newest(settled)
    assert newest is not None and _etag(newest[3][1]) == '"e1"'


def test_a_pin_rewritten_after_the_settle_is_never_served_stale(settled: Any) -> None:
    # WHEN a settled shard row's pin is rewritten by hand (an operator mending a row)
    settled.execute(
        "UPDATE training_checkpoint_shards SET objects = jsonb_set(objects, '{0,etag}',"
        " '\"mended\"') WHERE job_id = 'w' AND step = 100 AND rank = 1"
    )
    # THEN the walk reads the row as it is now (from the shard rows: the manifest is gone)
    newest = _newest(settled)
    assert newest is not None and _etag(newest[3][1]) == "mended"
    assert _walk_reads_shard_rows(settled, "w")


@pytest.mark.parametrize(
    "change",
    [
        "DELETE FROM training_checkpoint_shards WHERE job_id = 'w' AND rank = 2",
        "UPDATE training_checkpoint_shards SET run_attempt = 7 WHERE job_id = 'w' AND rank = 2",
    ],
    ids=["deleted", "moved to another attempt"],
)
def test_a_row_taken_out_by_hand_is_never_served_from_the_manifest(
    clean_db: str, settled: Any, change: str
) -> None:
    # WHEN one settled row is deleted, or moved to another attempt, by hand (the checkpoint row
    # left as it is)
    settled.execute(change)
    # THEN the walk sees the two rows left, and the helper resumes from nothing
    shards = next(complete_checkpoints(settled, "w"))[4]
    assert isinstance(shards, ShardRows)
    assert sorted(shards) == [0, 1] and not shards.ranks_are(3)
    assert latest_complete_checkpoint("w", database_url=clean_db, check_files=False) is None


def test_a_newer_attempt_and_a_larger_world_are_read_as_they_settle(
    clean_db: str, settled: Any
) -> None:
    # WHEN a newer attempt of the step reports one rank THEN the step is no longer complete
    _write(clean_db, _report(100, 0, attempt=1, etag="n"))
    assert _newest(settled) is None
    # WHEN the rest of it reports THEN it is complete at that attempt, its manifest rebuilt
    _write(clean_db, _report(100, 1, attempt=1, etag="n"), _report(100, 2, attempt=1, etag="n"))
    assert not _walk_reads_shard_rows(settled, "w")
    newest = _newest(settled)
    assert newest is not None and newest[:3] == (100, 1, 3)
    assert {_etag(r) for r in newest[3].values()} == {'"n0"', '"n1"', '"n2"'}
    # WHEN a report of the same attempt with a larger world size arrives (a late rank) THEN
    # the step waits for the rest, and reads all five once they are there
    _write(clean_db, _report(100, 3, attempt=1, world=5))
    assert _newest(settled) is None
    _write(clean_db, _report(100, 4, attempt=1, world=5))
    newest = _newest(settled)
    assert newest is not None and newest[:3] == (100, 1, 5) and sorted(newest[3]) == list(range(5))
    assert not _walk_reads_shard_rows(settled, "w")
