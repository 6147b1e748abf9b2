"""The resume lookup's plan: one index probe for the checkpoint and one primary-key range of its
manifest's rows (migration 0013), no shard row; without a manifest, a second statement reads one
primary-key range of its shards aggregated into one row; whatever the job's size (EXPLAIN ANALYZE
on the real server; the timings at 10 million shard rows are in ``python -m bench read_paths``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from trainer_client.restart.shard_rows import SHARD_AGGREGATES_OF
from trainer_client.restart.walk import _BIGINT_MAX, _LATEST_COMPLETE

RANKS, CHECKPOINTS = 1000, 40

FILL = """
INSERT INTO training_checkpoints (job_id, step, epoch, run_attempt, world_size, shards_present,
                                  is_complete, first_reported_at, completed_at)
SELECT j, s * 100, s, 0, %(ranks)s, %(ranks)s, s < %(checkpoints)s, now(), now()
FROM unnest(ARRAY['plan-a', 'plan-b']) j, generate_series(1, %(checkpoints)s) s;
INSERT INTO training_checkpoint_shards (job_id, step, rank, run_attempt, epoch, world_size, uri,
                                        size_bytes, objects, reported_at)
SELECT j, s * 100, r, 0, s, %(ranks)s, u, 16,
       jsonb_build_array(jsonb_build_object('uri', u, 'bytes', 16)), now()
FROM unnest(ARRAY['plan-a', 'plan-b']) j, generate_series(1, %(checkpoints)s) s,
     generate_series(0, %(ranks)s - 1) r,
     LATERAL (SELECT 's3://b/' || j || '/step-' || s * 100 || '/__' || r || '_0.distcp') x(u)
"""


@pytest.fixture
def filled(clean_db: str) -> Iterator[Any]:
    # GIVEN two jobs of 40 checkpoints x 1,000 ranks (the newest of each incomplete)
    with psycopg.connect(clean_db, autocommit=True) as conn:
        for statement in FILL.split(";"):
            conn.execute(statement, {"ranks": RANKS, "checkpoints": CHECKPOINTS})
        conn.execute("ANALYZE training_checkpoints, training_checkpoint_shards")
        yield conn


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _plan(conn: Any, sql: str, params: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    (answer,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
    plan = (answer if isinstance(answer, list) else json.loads(answer))[0]["Plan"]
    return plan, list(_nodes(plan))


def test_the_newest_complete_checkpoint_and_only_its_shards_are_read_by_index(filled: Any) -> None:
    # GIVEN no manifest (checkpoints completed before migration 0013)
    params = {"job_id": "plan-a", "before": _BIGINT_MAX}
    # THEN no sequential scan and no sort: the checkpoint from the partial "latest complete"
    # index and its manifest's probe (none: one row of NULLs) ...
    plan, nodes = _plan(filled, _LATEST_COMPLETE, params)
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")], nodes
    scans = {n["Relation Name"]: n for n in nodes if "Relation Name" in n}
    assert scans["training_checkpoints"]["Index Name"] == "training_checkpoints_latest_complete_idx"
    assert scans["training_checkpoint_manifests"]["Actual Rows"] == 0
    assert "training_checkpoint_shards" not in scans
    assert plan["Actual Rows"] == 1
    (row,) = filled.execute(_LATEST_COMPLETE, params).fetchall()
    # ... and the step is the newest complete one (39, not the incomplete 40); then its shards
    # from the primary key's range (job_id, step), exactly one checkpoint's rows, one row back
    assert row[0] == 3900 and row[4] is None
    key = {"job_id": "plan-a", "step": row[0], "run_attempt": row[2]}
    plan, nodes = _plan(filled, SHARD_AGGREGATES_OF, key)
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")], nodes
    shards = [n for n in nodes if n.get("Index Name") == "training_checkpoint_shards_pkey"]
    assert len(shards) == 1 and shards[0]["Actual Rows"] == RANKS
    assert plan["Actual Rows"] == 1
    assert filled.execute(SHARD_AGGREGATES_OF, key).fetchone()[0] == RANKS


def test_with_a_manifest_no_shard_row_is_read(filled: Any) -> None:
    # GIVEN the manifests the settle builds (chunks of 300 ranks here: 4 rows each), for every
    # complete checkpoint of both jobs
    filled.execute(
        "SELECT ckpt_build_manifest(job_id, step, 300) FROM training_checkpoints WHERE is_complete"
    )
    filled.execute("ANALYZE training_checkpoint_manifests")
    params = {"job_id": "plan-a", "before": _BIGINT_MAX}
    plan, nodes = _plan(filled, _LATEST_COMPLETE, params)
    # THEN no sequential scan and no sort: the checkpoint from the partial index, its manifest's
    # rows by the manifests' primary key, and no shard row
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")], nodes
    by_index = {n["Index Name"]: n for n in nodes if "Index Name" in n}
    assert by_index["training_checkpoints_latest_complete_idx"]["Actual Rows"] == 1
    assert by_index["training_checkpoint_manifests_pkey"]["Actual Rows"] == 4
    assert not [n for n in nodes if n.get("Relation Name") == "training_checkpoint_shards"]
    assert plan["Actual Rows"] == 4
    # ... and the rows are the newest complete step's, with its rows
    rows = filled.execute(_LATEST_COMPLETE, params).fetchall()
    assert {r[0] for r in rows} == {3900} and sum(r[6] for r in rows) == RANKS
