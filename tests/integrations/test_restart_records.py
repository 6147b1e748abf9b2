"""Every restart on the record: a job relaunched several times leaves one ``ckpt.restart.v1``
record per launch in the database (through the queue and the real writer), with the step it
resumed from, the newer candidates it skipped and why, steps lost and timings; ``restarts``
shows them and what they cost, ``report`` draws them; three restarts in a row from one
checkpoint warn, and with ``step_back_on_loop`` the next resumes from the one before.
Fresh interpreters, moto's SQS, the test database."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.trainer_client.helpers import child_env, run_child
from trainer_client import CheckpointReporter

pytestmark = pytest.mark.slow
CONSOLE_SCRIPT = Path(sys.executable).parent / "ckpt-pipeline"

# One launch of a one-rank job: the restart's call, then a report per step in argv[4:].
LAUNCH = """
import sys
from pathlib import Path
from trainer_client import CheckpointReporter
from trainer_client.restart.resume import resume

database_url, ckpt, step_back = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "1"
reporter = CheckpointReporter(rank=0, world_size=1, install_signal_handler=False, spot_poll=False)
resumed = resume(reporter, database_url=database_url, deadline_s=20, step_back_on_loop=step_back)
print(f"resumed: {None if resumed is None else resumed.step}")
for step in map(int, sys.argv[4:]):
    path = ckpt / f"step-{step}" / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")
    reporter.report(step=step, epoch=0, uri=path.as_uri(), loss=1.0 / step)
assert reporter.flush(30)
reporter.close()
"""


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _launch(
    pipeline: LocalPipeline, tmp: Path, job: str, steps: list[int], *, step_back: bool = False
) -> tuple[str, str]:
    env = {**pipeline.client_env(), "CKPT_JOB_ID": job, "CKPT_SPOOL_DIR": str(tmp / "spool")}
    child = run_child(
        LAUNCH,
        pipeline.database_url,
        str(tmp / "ckpt"),
        "1" if step_back else "0",
        *map(str, steps),
        timeout=120,
        **env,
    )
    assert child.returncode == 0, child.stderr
    settle(pipeline)
    return child.stdout, child.stderr


def _cli(pipeline: LocalPipeline, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args],
        env=child_env(DATABASE_URL=pipeline.database_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_each_restart_leaves_a_record_and_a_loop_is_caught(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    job = f"records-{uuid.uuid4().hex[:8]}"
    # GIVEN a first launch that saved steps 5, 10 and 20
    out, _ = _launch(pipeline, tmp_path, job, [5, 10, 20])
    assert "resumed: None" in out
    # AND step 20's file is gone (deleted by hand), and a step 30 of a larger world has one rank
    (tmp_path / "ckpt" / "step-20" / "model.pt").unlink()
    with CheckpointReporter(
        pipeline.queues.queue_url, job_id=job, spool_dir=tmp_path / "other", rank=0,
        world_size=2, run_attempt=0, endpoint_url=pipeline.endpoint_url,
        install_signal_handler=False, spot_poll=False,
    ) as other:  # fmt: skip
        other.report(step=30, epoch=0, uri=(tmp_path / "ckpt" / "s30").as_uri())
        assert other.flush(30)
    settle(pipeline)

    # WHEN the job is relaunched three times, each launch dying before its next checkpoint
    lines = [_launch(pipeline, tmp_path, job, [])[1] for _ in range(3)]

    # THEN each resumed from step 10, skipping step 30 (incomplete) and 20 (damaged), and the
    # third said it is a loop
    assert all("resuming from step 10" in err for err in lines), lines
    assert "restart loop" not in lines[0] + lines[1]
    (loop,) = [x for x in lines[2].splitlines() if "restart loop" in x]
    assert "restart 3 in a row from step 10" in loop and "step_back_on_loop" in loop
    # AND the database holds one record per launch (the first launch's from scratch)
    document = json.loads(_cli(pipeline, "restarts", "--job", job, "--json").stdout)
    records = document["restarts"]
    assert [r["resumed_step"] for r in records] == [None, 10, 10, 10]
    assert [r["run_attempt"] for r in records] == [0, 1, 2, 3]
    relaunch = records[1]
    assert [(s["step"], s["kind"]) for s in relaunch["skipped"]] == [
        (30, "incomplete"),
        (20, "damaged"),
    ]
    assert relaunch["skipped"][0]["missing_ranks"] == [1]
    assert "model.pt" in relaunch["skipped"][1]["reason"]
    assert relaunch["newest_saved_step"] == 30 and relaunch["steps_lost"] == 20
    assert relaunch["decided_s"] > 0 and relaunch["restored_s"] >= relaunch["decided_s"]
    assert document["cost"]["restarts"] == 3 and document["cost"]["steps_lost"] == 60
    ratio = document["cost"]["effective_training_time_ratio"]
    assert ratio is not None and 0 <= ratio <= 1
    with psycopg.connect(pipeline.database_url) as conn:
        loops = conn.execute(
            "SELECT count(*) FROM training_job_restarts WHERE job_id = %s"
            " AND loop_restarts + 1 >= loop_after",
            (job,),
        ).fetchone()
    assert loops == (1,)
    # AND status shows them, in its table and its JSON
    status = _cli(pipeline, "status", "--job", job)
    assert "restarts:" in status.stdout, status.stdout + status.stderr
    assert (
        "run_attempt 3: resumed from step 10" in status.stdout and "RESTART LOOP" in status.stdout
    )
    status_json = json.loads(_cli(pipeline, "status", "--job", job, "--json").stdout)
    assert [r["resumed_step"] for r in status_json["restarts"]["restarts"]] == [None, 10, 10, 10]
    # AND checkpoints marks what the newest restart found: step 20 is complete in the rows, and
    # damaged (its file gone), step 30 incomplete
    listing = _cli(pipeline, "checkpoints", "--job", job, "--no-check-files")
    assert "step 20: damaged at the restart of run_attempt 3:" in listing.stdout, listing.stdout
    found = {
        c["step"]: (c["restart_found"] or {}).get("kind")
        for c in json.loads(
            _cli(pipeline, "checkpoints", "--job", job, "--no-check-files", "--json").stdout
        )["checkpoints"]
    }
    assert found == {5: None, 10: None, 20: "damaged", 30: "incomplete"}
    # AND the table, and a picture of the job's story
    table = _cli(pipeline, "restarts", "--job", job)
    assert table.returncode == 0, table.stderr
    assert (
        "resumed from step 10" in table.stdout and "effective training time ratio" in table.stdout
    )
    picture = tmp_path / "job.png"
    drawn = _cli(pipeline, "report", "--job", job, "--out", str(picture))
    assert drawn.returncode == 0, drawn.stderr
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000

    # WHEN the fourth relaunch opts in to stepping back
    out, err = _launch(pipeline, tmp_path, job, [], step_back=True)
    # THEN it resumes from step 5, the one before the loop's checkpoint, and says why
    assert "resumed: 5" in out
    assert "stepping back from step 10 to step 5" in err
