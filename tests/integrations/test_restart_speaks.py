"""The restart speaks, with logging unconfigured (as in a user's script): one line on stderr with
its decision and why, and a refusal, not a silent start from scratch, when the spool holds
reports the queue refused (a typo in CKPT_QUEUE_URL). Fresh interpreters, moto's SQS, the real
writer, the test database."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from tests.trainer_client.helpers import run_child
from trainer_client.storage.restore_fetch import FetchTrace

# One process of a one-rank job: a reporter on the job's spool, the restart's call (logging left
# unconfigured), then a report per step in argv[3:] of a file under argv[2]; prints the outcome.
LAUNCH = """
import sys
from pathlib import Path
from trainer_client import CheckpointReporter
from trainer_client.exceptions import ResumeError
from trainer_client.restart.resume import resume

database_url, ckpt = sys.argv[1], Path(sys.argv[2])
reporter = CheckpointReporter(
    rank=0, world_size=1, install_signal_handler=False, spot_poll=False, close_timeout_s=1,
    backoff_cap_s=0.5,
)
try:
    resumed = resume(reporter, database_url=database_url, deadline_s=6)
except ResumeError as exc:
    print(f"refused: {exc}")
    reporter.close()
    raise SystemExit(3)
print(f"resumed: {None if resumed is None else resumed.step}")
for step in map(int, sys.argv[3:]):
    path = ckpt / f"step-{step}" / "model.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")
    reporter.report(step=step, epoch=0, uri=path.as_uri(), loss=1.0 / step)
reporter.close()
"""


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _launch(
    pipeline: LocalPipeline, tmp: Path, job: str, steps: list[int], *, queue_url: str | None = None
) -> tuple[int, str, str]:
    env = {
        **pipeline.client_env(),
        "CKPT_JOB_ID": job,
        "CKPT_SPOOL_DIR": str(tmp / "spool"),
    }
    if queue_url is not None:
        env["CKPT_QUEUE_URL"] = queue_url
    child = run_child(
        LAUNCH,
        pipeline.database_url,
        str(tmp / "ckpt"),
        *map(str, steps),
        timeout=120,
        **env,
    )
    return child.returncode, child.stdout, child.stderr


def test_the_decision_and_what_it_skipped_are_on_stderr(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    job = f"speaks-{uuid.uuid4().hex[:8]}"
    # GIVEN a job with steps 10 and 20 complete, and step 20's file since removed by hand
    code, out, err = _launch(pipeline, tmp_path, job, [10, 20])
    assert code == 0, err
    settle(pipeline)
    (tmp_path / "ckpt" / "step-20" / "model.pt").unlink()
    # WHEN it is launched again, with logging unconfigured
    code, out, err = _launch(pipeline, tmp_path, job, [])
    # THEN it resumed from step 10, and said so on stderr, with step 20 skipped and why, and the
    # attempt this launch reports as
    assert code == 0, err
    assert "resumed: 10" in out
    lines = [x for x in err.splitlines() if x.startswith("ckpt-pipeline: restart of job")]
    assert len(lines) == 1, err
    line = lines[0]
    assert f"restart of job {job}: resuming from step 10 (run_attempt 0, 1 ranks" in line
    assert "this launch reports as run_attempt 1" in line
    assert "skipped: step 20: damaged (" in line and "model.pt: missing" in line


def test_a_typo_queue_at_restart_refuses_instead_of_starting_from_scratch(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    job = f"typo-{uuid.uuid4().hex[:8]}"
    typo = pipeline.queues.queue_url.replace(".fifo", "-typo.fifo")
    # GIVEN a launch whose queue URL has a typo: steps 10..40 stay in its spool
    code, _, err = _launch(pipeline, tmp_path, job, [10, 20, 30, 40], queue_url=typo)
    assert code == 0, err
    # WHEN it is relaunched with the same environment
    code, out, err = _launch(pipeline, tmp_path, job, [], queue_url=typo)
    # THEN it refuses in one line naming the send error and what to do, on every rank
    assert code == 3, out + err
    (refusal,) = [x for x in out.splitlines() if x.startswith("refused:")]
    assert "refusing to start from scratch" in refusal
    # (its 4 reports and the first launch's restart record)
    assert "could not send 5 spooled message(s) of an earlier launch" in refusal
    assert "NonExistentQueue" in refusal or "QueueDoesNotExist" in refusal, refusal
    assert "CKPT_QUEUE_URL" in refusal and "start_over=True" in refusal
    # AND with the URL fixed, the same restart sends the spool and resumes from step 40
    code, out, err = _launch(pipeline, tmp_path, job, [])
    assert code == 0, err
    assert "resumed: 40" in out


def test_a_long_restore_says_how_far_it_is(caplog: pytest.LogCaptureFixture) -> None:
    # GIVEN a restore's trace that advances while the progress line is due every 50 ms
    from trainer_client.restart.say import RestoreProgress

    trace = FetchTrace()
    with (
        caplog.at_level("INFO", logger="trainer_client.restart.resume"),
        RestoreProgress(trace, 10_000_000, after_s=0.05),
    ):
        trace.add_written(4_000_000)
        _wait_for(lambda: any("restoring:" in r.getMessage() for r in caplog.records))
    # THEN it said how many bytes of how many, and the rate
    line = next(r.getMessage() for r in caplog.records if "restoring:" in r.getMessage())
    assert "4.0 MB of 10.0 MB written" in line and "MB/s" in line


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "not said within 10 s"
        time.sleep(0.01)
