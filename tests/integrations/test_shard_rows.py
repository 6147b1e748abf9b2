"""The resume walk's shard rows read as a few aggregated texts (trainer_client/integrations/
shard_rows.py): the same records as one row per shard, whatever the rows hold."""

from __future__ import annotations

import json
import pickle
from typing import Any

import psycopg
import pytest

from trainer_client.integrations.resume import (
    complete_checkpoints,
    latest_complete_checkpoint,
)
from trainer_client.integrations.shard_rows import SHARD_ROWS, RankUris, ShardRows
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


@pytest.fixture
def conn(clean_db: str) -> Any:
    with psycopg.connect(clean_db, autocommit=True) as connection:
        yield connection


def test_the_aggregated_read_gives_the_rows_one_per_row_reads(conn: Any) -> None:
    # GIVEN a complete checkpoint whose rows hold their pins in every way the tables allow
    _fill(conn, 100, ROWS, complete=True)
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


def test_a_uri_with_a_newline_is_read_one_row_per_shard(conn: Any) -> None:
    # GIVEN a row written by hand whose URI holds a newline, and another whose SHA-256 holds a
    # comma (the contract accepts neither; the texts could not carry them)
    for step, row in (
        (100, ("s3://b/job/a\nb.pt", 1, None, None, {})),
        (200, ("s3://b/job/c.pt", 1, "x,y", None, {})),
    ):
        _fill(conn, step, {0: row}, complete=True)
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
