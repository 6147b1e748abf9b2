"""Property: every report that ``report()`` accepts is stored by every hop — client spool, moto's
SQS, the real writer, PostgreSQL — and none ends in the DLQ."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_contract import InvalidMessage
from ckpt_pipeline.local.pipeline import LocalPipeline, local_pipeline
from tests.trainer_client.helpers import wait_for
from trainer_client import CheckpointReporter

pytestmark = pytest.mark.slow

INT64_MAX = 2**63 - 1
# Any code point at all: the contract, not the strategy, must decide what is storable.
text = st.text(max_size=40)
finite = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
report_fields = st.fixed_dictionaries(
    {
        "epoch": st.integers(0, INT64_MAX + 2),
        "uri": st.text(min_size=1, max_size=60),
        "loss": st.none() | finite | st.floats(),
        "metrics": st.dictionaries(st.text(min_size=1, max_size=12), finite, max_size=4),
        "bytes": st.none() | st.integers(0, INT64_MAX + 2),
        "extra": st.dictionaries(st.text(min_size=1, max_size=12), json_values, max_size=3),
    }
)


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalPipeline]:
    from tests.conftest import ADMIN_URL  # the shared server; a fresh database below

    name = f"ckpt_prop_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=name)
    try:
        with local_pipeline(url) as running:
            yield running
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _rows(url: str, job_id: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM training_checkpoint_shards WHERE job_id = %s", (job_id,)
        ).fetchone()
    return int(row[0]) if row else 0


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(report_fields, min_size=10, max_size=25))
def test_accepted_reports_all_reach_postgresql_and_none_the_dlq(
    pipeline: LocalPipeline, tmp_path: Path, reports: list[dict[str, Any]]
) -> None:
    job_id = f"prop-{uuid.uuid4().hex[:12]}"
    accepted = 0
    with CheckpointReporter(
        pipeline.queues.queue_url,
        job_id=job_id,
        spool_dir=tmp_path,
        rank=0,
        world_size=1,
        spot_poll=False,
        install_signal_handler=False,
    ) as rep:
        for step, fields in enumerate(reports):
            try:
                rep.report(step=step, **fields)
            except InvalidMessage:
                continue
            accepted += 1
        assert rep.flush(30) and rep.stats.failed == 0
    assert accepted == rep.stats.sent
    wait_for(lambda: _rows(pipeline.database_url, job_id) == accepted, timeout=60)
    assert pipeline.dlq_depth() == 0
