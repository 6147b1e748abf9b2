"""The scheduled prune's function against the real PostgreSQL: the writer stores a job through
moto's FIFO queue, the function prunes it as role ``ckpt_pruner`` (migration 0011), and the role
can do that and nothing else of the writer's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from ckpt_contract import CheckpointReport, encode
from ckpt_pipeline.local.lambda_context import context_for
from lambda_writer import SettingsError, WriterSettings, make_handler
from lambda_writer.prune import handler as prune_handler
from lambda_writer.prune.handler import PrunerSettings, run_prune
from lambda_writer.prune.policy import RetentionPolicy
from lambda_writer.shared.constants import PRUNER_DB_USER, PRUNER_TIMEOUT_S
from tests.lambda_writer.helpers import EventFactory

JOB = "job-sched"
POLICY = RetentionPolicy(keep_last=2, keep_best=1, metric="loss", superseded=True)


def report(step: int, attempt: int, world: int, rank: int, loss: float) -> str:
    return encode(
        CheckpointReport.create(
            job_id=JOB,
            run_attempt=attempt,
            step=step,
            epoch=step // 10,
            rank=rank,
            world_size=world,
            uri=f"file:///ckpt/{JOB}/step-{step}/rank-{rank}.pt",
            loss=loss,
            created_at=datetime.now(UTC),
        )
    )


@pytest.fixture
def stored_job(writer_settings: WriterSettings, make_event: EventFactory) -> str:
    """Steps 10-100 complete on 2 ranks (step 30 the best by loss; step 60 with a superseded
    attempt-0 shard row on 3 ranks), step 110 in progress; the database's URL."""
    bodies: list[str] = []
    for step in range(10, 101, 10):
        loss = 0.1 if step == 30 else 1.0 + step / 1000
        if step == 60:
            bodies += [report(60, 0, 3, rank, 9.0) for rank in range(3)]
            bodies += [report(60, 1, 2, rank, loss) for rank in range(2)]
        else:
            bodies += [report(step, 0, 2, rank, loss) for rank in range(2)]
    bodies.append(report(110, 0, 2, 0, 0.01))
    handler = make_handler(writer_settings, emit_metrics=False)
    for start in range(0, len(bodies), 10):
        result = handler(make_event(bodies[start : start + 10]), context_for(timeout_s=60))
        assert result == {"batchItemFailures": []}
    assert writer_settings.database_url is not None
    return writer_settings.database_url


def as_pruner(url: str) -> str:
    return make_conninfo(url, user=PRUNER_DB_USER)


def rows(url: str) -> tuple[list[int], list[tuple[int, int, int]], list[tuple[int, int]]]:
    with psycopg.connect(url) as conn:
        steps = conn.execute(
            "SELECT step FROM training_checkpoints WHERE job_id = %s ORDER BY step", (JOB,)
        ).fetchall()
        shards = conn.execute(
            "SELECT step, rank, run_attempt FROM training_checkpoint_shards WHERE job_id = %s"
            " ORDER BY step, rank",
            (JOB,),
        ).fetchall()
        fenced = conn.execute(
            "SELECT step, min_run_attempt FROM training_checkpoint_tombstones WHERE job_id = %s"
            " ORDER BY step",
            (JOB,),
        ).fetchall()
    return [s for (s,) in steps], [tuple(r) for r in shards], [tuple(r) for r in fenced]


@pytest.fixture
def pruner_env(stored_job: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The function's environment as the stack sets it (here a URL as role ckpt_pruner)."""
    monkeypatch.setenv("DATABASE_URL", as_pruner(stored_job))
    monkeypatch.setenv("PRUNE_POLICY", POLICY.to_json())
    prune_handler._settings.cache_clear()
    yield stored_job
    prune_handler._settings.cache_clear()


def test_the_function_prunes_as_ckpt_pruner(pruner_env: str) -> None:
    # GIVEN the stored job WHEN one scheduled run (the Lambda entry point) THEN the policy's
    # checkpoints are gone: kept are the 2 newest complete (90, 100), the best by loss (30) and
    # the one in progress (110); step 60 went with its superseded row; each removal fenced.
    result = prune_handler.handler({}, context_for(timeout_s=PRUNER_TIMEOUT_S))
    steps, shards, fenced = rows(pruner_env)
    assert steps == [30, 90, 100, 110]
    assert [(s, r) for s, r, _ in shards] == [(30, 0), (30, 1), (90, 0), (90, 1), (100, 0),
                                              (100, 1), (110, 0)]  # fmt: skip
    assert [s for s, _ in fenced] == [10, 20, 40, 50, 60, 70, 80]
    assert result == {
        "jobs_planned": 1,
        "checkpoints_pruned": 7,
        "shard_rows_pruned": 15,
        "stopped_early": False,
    }
    # AND a second run finds nothing more to remove
    again = prune_handler.handler({}, context_for(timeout_s=PRUNER_TIMEOUT_S))
    assert again["checkpoints_pruned"] == 0 and rows(pruner_env)[0] == steps


def test_a_run_near_its_deadline_takes_no_new_job(stored_job: str) -> None:
    settings = PrunerSettings(WriterSettings(database_url=as_pruner(stored_job)), POLICY)
    run = run_prune(settings, remaining_ms=lambda: 1_000)
    assert run.stopped_early and run.outcomes == ()
    assert rows(stored_job)[0] == list(range(10, 111, 10))


def test_the_pruner_role_can_prune_and_nothing_else(stored_job: str) -> None:
    with psycopg.connect(as_pruner(stored_job), autocommit=True) as conn:
        for statement in (
            "INSERT INTO training_checkpoint_counts SELECT * FROM training_checkpoint_counts",
            "UPDATE training_checkpoints SET is_complete = false",
            "TRUNCATE training_checkpoint_shards",
            "DELETE FROM training_checkpoint_tombstones",
            "SELECT * FROM schema_migrations",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


@pytest.mark.parametrize(
    ("env", "rule"),
    [
        ({}, "is required"),
        ({"PRUNE_POLICY": "{"}, "must be a JSON object"),
        ({"PRUNE_POLICY": '{"keep_last": 0}'}, "--keep-last: must be at least 1"),
        ({"PRUNE_POLICY": '{"keep_lost": 3}'}, "keys among"),
    ],
)
def test_policy_errors_name_the_variable(env: dict[str, str], rule: str) -> None:
    with pytest.raises(SettingsError) as caught:
        PrunerSettings.from_env({"DATABASE_URL": "postgresql://x", **env})
    assert caught.value.name == "PRUNE_POLICY" and rule in caught.value.rule


def test_the_policy_round_trips_through_its_json() -> None:
    assert RetentionPolicy.from_json(POLICY.to_json()) == POLICY
