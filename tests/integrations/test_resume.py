"""latest_complete_checkpoint: reports through moto and the real writer, read from PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.conftest import empty_database
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from trainer_client import CheckpointReporter
from trainer_client.exceptions import ExtraMissing, ResumeError
from trainer_client.restart.lookup import (
    ResumePoint,
    checkpoint_path,
    latest_complete_checkpoint,
    next_run_attempt,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def report(
    pipeline: LocalPipeline,
    spool: Path,
    job_id: str,
    reports: list[tuple[int, int, int, str]],
    *,
    world_size: int,
    run_attempt: int = 0,
) -> None:
    """Each (step, epoch, rank, uri) reported by that rank's own reporter, then written."""
    ranks = sorted({rank for _, _, rank, _ in reports})
    reporters = {
        rank: CheckpointReporter(
            pipeline.queues.queue_url,
            job_id=job_id,
            spool_dir=spool,
            rank=rank,
            world_size=world_size,
            run_attempt=run_attempt,
            endpoint_url=pipeline.endpoint_url,
            install_signal_handler=False,
            spot_poll=False,
        )
        for rank in ranks
    }
    try:
        for step, epoch, rank, uri in reports:
            reporters[rank].report(step=step, epoch=epoch, uri=uri, loss=0.5)
        assert all(r.flush(30) for r in reporters.values())
    finally:
        for r in reporters.values():
            r.close()
    settle(pipeline)


def touch(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"ckpt")
    return path.as_uri()


# -- the path rule (pure) ------------------------------------------------------------------------


def test_one_uri_for_every_rank_is_the_path_and_file_uris_become_local_paths() -> None:
    assert checkpoint_path({0: "file:///ck/step%3D10.ckpt", 1: "file:///ck/step%3D10.ckpt"}) == (
        "/ck/step=10.ckpt"
    )
    assert checkpoint_path({0: "s3://bucket/job/step-10.ckpt"}) == "s3://bucket/job/step-10.ckpt"
    assert checkpoint_path({0: "file:///out/checkpoint-10/"}) == "/out/checkpoint-10"


def test_sharded_uris_resolve_to_their_checkpoint_directory() -> None:
    uris = {0: "file:///ck/step-10/rank-0.distcp", 1: "file:///ck/step-10/rank-1.distcp"}
    assert checkpoint_path(uris) == "/ck/step-10"
    s3 = {0: "s3://b/job/step-10/__0_0.distcp", 1: "s3://b/job/step-10/__1_0.distcp"}
    assert checkpoint_path(s3) == "s3://b/job/step-10"


@pytest.mark.parametrize(
    ("uris", "rule"),
    [
        ({0: "s3://a/step-1/r0", 1: "s3://b/step-1/r1"}, "different stores"),
        ({0: "file:///r0.pt", 1: "file:///r1.pt"}, "no checkpoint directory"),
        ({0: "file://otherhost/ck/step-1.ckpt"}, "another host"),
        ({}, "no shard URIs"),
    ],
)
def test_uris_that_name_no_single_location_are_refused(uris: dict[int, str], rule: str) -> None:
    with pytest.raises(ResumeError, match=rule):
        checkpoint_path(uris)


# -- against the database ------------------------------------------------------------------------


def test_latest_complete_checkpoint_skips_incomplete_and_superseded_attempts(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    job = f"resume-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "ckpt"
    u10, u20, u30 = (touch(ckpt / f"step={s}.ckpt") for s in (10, 20, 30))
    # GIVEN step 10 and 20 complete (both ranks), step 30 reported by rank 0 only
    report(
        pipeline,
        tmp_path / "spool",
        job,
        [(10, 0, 0, u10), (10, 0, 1, u10), (20, 1, 0, u20), (20, 1, 1, u20), (30, 2, 0, u30)],
        world_size=2,
    )
    # ... and another job's newer complete checkpoint, which must not leak in
    report(pipeline, tmp_path / "spool", "other-job", [(99, 9, 0, u30)], world_size=1)
    # THEN the newest complete one is step 20, with every rank's uri and a local path
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url)
    assert point == ResumePoint(
        job_id=job,
        step=20,
        epoch=1,
        run_attempt=0,
        world_size=2,
        uris={0: u20, 1: u20},
        path=str(ckpt / "step=20.ckpt"),
    )
    # WHEN a restarted attempt re-reports step 20 from one rank only, it is no longer complete
    report(pipeline, tmp_path / "spool", job, [(20, 1, 0, u20)], world_size=2, run_attempt=1)
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url)
    assert point is not None and (point.step, point.run_attempt) == (10, 0)
    assert latest_complete_checkpoint("never-ran", database_url=pipeline.database_url) is None
    # ... and a launch resuming this job reports as attempt 2; a new job starts at 0
    assert next_run_attempt(job, database_url=pipeline.database_url) == 2
    assert next_run_attempt("never-ran", database_url=pipeline.database_url) == 0


def test_a_complete_checkpoint_whose_file_is_gone_is_skipped_unless_told_not_to_check(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    job = f"rotated-{uuid.uuid4().hex[:8]}"
    ckpt = tmp_path / "ckpt"
    reports = [(s, s // 10, 0, touch(ckpt / f"step={s}.ckpt")) for s in range(10, 260, 10)]
    report(pipeline, tmp_path / "spool", job, reports, world_size=1)
    # GIVEN the newest 23 rotated away (more than one page of the walk back)
    for step in range(30, 260, 10):
        (ckpt / f"step={step}.ckpt").unlink()
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url)
    assert point is not None and point.step == 20
    unchecked = latest_complete_checkpoint(
        job, database_url=pipeline.database_url, check_files=False
    )
    assert unchecked is not None and unchecked.step == 250


def test_the_helper_reads_with_a_select_only_role(pipeline: LocalPipeline, tmp_path: Path) -> None:
    # GIVEN a role that may only SELECT (what a training job should get)
    job = f"ro-{uuid.uuid4().hex[:8]}"
    uri = touch(tmp_path / "step=5.ckpt")
    report(pipeline, tmp_path / "spool", job, [(5, 0, 0, uri)], world_size=1)
    role = f"resume_ro_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pipeline.database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT SELECT ON complete_checkpoints, training_checkpoint_shards TO {role}")
    try:
        url = psycopg.conninfo.make_conninfo(pipeline.database_url, user=role)
        point = latest_complete_checkpoint(job, database_url=url)
        assert point is not None and point.path == str(tmp_path / "step=5.ckpt")
    finally:
        with psycopg.connect(pipeline.database_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


# -- bad input and a missing extra ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_id", "url", "name"),
    [
        ("has space", "postgresql://x@127.0.0.1/db", "job_id"),
        ("job", "", "database_url"),
        ("job", "mysql://u:secret@h/db", "database_url"),
        ("job", "not a dsn", "database_url"),
    ],
)
def test_bad_input_names_the_argument_and_never_echoes_the_url(
    job_id: str, url: str, name: str
) -> None:
    with pytest.raises(ResumeError) as caught:
        latest_complete_checkpoint(job_id, database_url=url)
    assert caught.value.name == name and "secret" not in str(caught.value)


def test_an_unreachable_or_unmigrated_database_is_a_resume_error() -> None:
    with pytest.raises(ResumeError, match="cannot connect"):
        latest_complete_checkpoint(
            "job", database_url="postgresql://u:secret@127.0.0.1:1/db?connect_timeout=2"
        )
    with (
        empty_database("resume_empty") as url,
        pytest.raises(ResumeError, match="run ckpt-pipeline migrate"),
    ):
        latest_complete_checkpoint("job", database_url=url)


def test_without_psycopg_the_helper_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # an import of it now fails
    with pytest.raises(ExtraMissing, match=r"ckpt-pipeline\[ops\]"):
        latest_complete_checkpoint("job", database_url="postgresql://x@127.0.0.1/db")


def test_importing_the_integrations_imports_neither_psycopg_nor_lightning() -> None:
    code = (
        "import sys, trainer_client.restart.lookup;"
        "print(sorted(m for m in ('psycopg', 'lightning', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"
