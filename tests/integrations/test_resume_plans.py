"""The resume lookup's plan: one index probe for the checkpoint, one primary-key range for its
shards aggregated into one row, whatever the job's size (EXPLAIN ANALYZE on the real server; the
timings at 10 million shard rows are in ``python -m bench read_paths``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from trainer_client.integrations.resume import _BIGINT_MAX, _LATEST_COMPLETE

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


def test_the_newest_complete_checkpoint_and_only_its_shards_are_read_by_index(filled: Any) -> None:
    params = {"job_id": "plan-a", "before": _BIGINT_MAX}
    (answer,) = filled.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + _LATEST_COMPLETE, params
    ).fetchone()
    plan = (answer if isinstance(answer, list) else json.loads(answer))[0]["Plan"]
    nodes = list(_nodes(plan))
    scans = {n["Relation Name"]: n for n in nodes if "Relation Name" in n}
    # THEN no sequential scan and no sort: the checkpoint from the partial "latest complete"
    # index, its shards from the primary key's range (job_id, step), exactly one checkpoint's
    # rows read, and one row returned
    assert not [n for n in nodes if n["Node Type"] in ("Seq Scan", "Sort")], nodes
    assert scans["training_checkpoints"]["Index Name"] == "training_checkpoints_latest_complete_idx"
    shards = [n for n in nodes if n.get("Index Name") == "training_checkpoint_shards_pkey"]
    assert len(shards) == 1 and shards[0]["Actual Rows"] == RANKS
    assert plan["Actual Rows"] == 1
    # ... and the step is the newest complete one (39, not the incomplete 40), with its rows
    rows = filled.execute(_LATEST_COMPLETE, params).fetchall()
    assert [(r[0], r[4]) for r in rows] == [(3900, RANKS)]
