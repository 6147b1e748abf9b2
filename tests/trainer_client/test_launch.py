"""Launch numbering on the reporter (trainer_client/report/launch.py), against moto's SQS: the first
report begins a launch one above the attempt the spool recorded; the restart call's launch wins
only before any report; the record is written once when a launch's first reports come from
several threads at once (async saves' callbacks)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues
from trainer_client import CheckpointReporter
from trainer_client.exceptions import ReporterConfigError
from trainer_client.report.launch import Launch, next_attempt, record_path, recorded_attempt


def _reporter(queues: PipelineQueues, spool: Path, **options: Any) -> CheckpointReporter:
    return CheckpointReporter(
        queues.queue_url,
        job_id="launch-job",
        spool_dir=spool,
        rank=0,
        world_size=1,
        install_signal_handler=False,
        spot_poll=False,
        **options,
    )


def test_next_attempt_is_above_every_attempt_seen() -> None:
    assert next_attempt(0) == 0
    assert next_attempt(0, None, None) == 0
    assert next_attempt(0, 0) == 1
    assert next_attempt(3, 1, None) == 3  # the launcher's own count when it is higher
    assert next_attempt(0, 4, 2) == 5


def test_each_process_of_a_job_reports_as_a_new_launch(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    # GIVEN a first process that reported, and a second one on the same spool (a relaunch)
    launches: list[tuple[int, str | None]] = []
    for step in (10, 20):
        with _reporter(pipeline_queues, tmp_path) as reporter:
            assert reporter.launch is None  # nothing begun before the first report
            report = reporter.report(step=step, epoch=0, uri=f"file:///ckpt/{step}")
            assert reporter.launch is not None
            launches.append((report.run_attempt, report.launch_id))
    # THEN the second reports one attempt above the first, under another launch id
    (first, first_id), (second, second_id) = launches
    assert (first, second) == (0, 1) and first_id != second_id
    assert recorded_attempt(tmp_path / "launch-job", 0) == 1
    saved = json.loads(record_path(tmp_path / "launch-job", 0).read_text())
    assert saved == {"run_attempt": 1, "launch_id": second_id}


def test_the_restart_calls_launch_only_before_the_first_report(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    with _reporter(pipeline_queues, tmp_path) as reporter:
        reporter.begin_launch(Launch(7, "from-the-restart", "restart"))
        report = reporter.report(step=1, epoch=0, uri="file:///ckpt/1")
        assert (report.run_attempt, report.launch_id) == (7, "from-the-restart")
        reporter.begin_launch(Launch(7, "from-the-restart", "restart"))  # the same: fine
        with pytest.raises(ReporterConfigError) as refused:
            reporter.begin_launch(Launch(8, "another", "restart"))
        assert refused.value.name == "run_attempt" and "before the first report" in str(
            refused.value
        )


def test_first_reports_from_many_threads_record_the_launch_once(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    # GIVEN a launch's first reports made by 8 threads at once (async saves completing together:
    # two threads once renamed the same temporary record, and one report was lost)
    with _reporter(pipeline_queues, tmp_path) as reporter:
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def report(step: int) -> None:
            start.wait()
            try:
                reporter.report(step=step, epoch=0, uri=f"file:///ckpt/{step}")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=report, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # THEN every report was spooled under the one launch, recorded once
        assert errors == []
        assert reporter.stats.reported == 8
        assert reporter.launch is not None
        assert recorded_attempt(tmp_path / "launch-job", 0) == reporter.launch.run_attempt
        assert sorted(p.name for p in (tmp_path / "launch-job").glob("*.launch*")) == [
            "rank-0.launch"
        ]
