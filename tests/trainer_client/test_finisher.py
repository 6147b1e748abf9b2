"""The finisher: reports follow durable (and hashed) files, off the caller's thread, bounded,
recovered from the spool at the next start; real files, moto's SQS, no stand-ins for our code."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_contract import InvalidMessage
from ckpt_pipeline.local.sqs_server import PipelineQueues, local_aws_env
from tests.trainer_client.helpers import drain, wait_for
from tests.trainer_client.holds import HoldUntilReleased, hold, release
from trainer_client import CheckpointReporter
from trainer_client.storage.durable import sha256_files
from trainer_client.torch_integration import atomic_torch_save_async


def _reporter(queue_url: str, spool: Path, **kw: Any) -> CheckpointReporter:
    options: dict[str, Any] = {
        "job_id": "fin-job",
        "rank": 0,
        "world_size": 1,
        "spot_poll": False,
        "install_signal_handler": False,
        "post_steps": [HoldUntilReleased()],
    }
    options.update(kw)
    return CheckpointReporter(queue_url, spool_dir=spool, **options)


def _checkpoint(directory: Path, sizes: dict[str, int]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, size in sizes.items():
        path = directory / name
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def _bodies(sqs: Any, queue_url: str, expect: int) -> list[dict[str, Any]]:
    return [json.loads(m["Body"]) for m in drain(sqs, queue_url, expect=expect, timeout=10.0)]


def _records(spool: Path) -> list[str]:
    return sorted(p.name for p in (spool / "fin-job" / "rank-0.finishing").glob("*.json"))


@pytest.fixture
def holds(tmp_path: Path) -> Path:
    return tmp_path / "holds"


def test_no_report_while_the_finisher_is_held_then_bytes_and_digests(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path, holds: Path
) -> None:
    url = pipeline_queues.queue_url
    first = _checkpoint(tmp_path / "ckpt" / "step-1", {"model.bin": 300_000, "optim.bin": 5_000})
    second = _checkpoint(tmp_path / "ckpt" / "step-2", {"model.bin": 70_000})
    with _reporter(url, tmp_path / "spool") as rep:
        # GIVEN the finisher held on step 1 (after its fsync, before its report) and step 2
        # queued behind it (before its fsync)
        one = rep.finish(
            first,
            base=first[0].parent,
            checksums=True,
            list_files=True,
            post=[hold(holds)],
            step=1,
            epoch=0,
            uri=first[0].parent.as_uri(),
        )
        two = rep.finish(second, checksums=True, step=2, epoch=0, uri=second[0].as_uri())
        wait_for(lambda: (holds / "held-1").exists())
        # THEN both calls returned, both jobs are on disk, and nothing is reported or sent
        assert not one.done() and not two.done()
        assert len(_records(tmp_path / "spool")) == 2
        assert rep.stats.reported == 0 and rep.stats.finishing == 2
        assert _bodies(sqs, url, expect=0) == []
        # WHEN released
        release(holds, 1)
        assert one.result(timeout=10).status == "reported"
        assert two.result(timeout=10).status == "reported"
        assert rep.flush(10)
    # THEN each report carries its files' bytes and digests, and the job records are gone
    bodies = {b["step"]: b for b in _bodies(sqs, url, expect=2)}
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in first}
    assert bodies[1]["bytes"] == 305_000 and bodies[1]["sha256"] is None
    assert bodies[1]["files"] == ["model.bin", "optim.bin"]
    assert bodies[1]["file_sha256"] == digests
    assert bodies[2]["bytes"] == 70_000
    assert bodies[2]["sha256"] == hashlib.sha256(second[0].read_bytes()).hexdigest()
    assert _records(tmp_path / "spool") == []


def test_a_checkpoint_rotated_away_while_finishing_is_not_reported(
    pipeline_queues: PipelineQueues,
    sqs: Any,
    tmp_path: Path,
    holds: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = pipeline_queues.queue_url
    (path,) = _checkpoint(tmp_path / "ckpt" / "step-3", {"model.bin": 10_000})
    with _reporter(url, tmp_path / "spool") as rep:
        done = rep.finish([path], post=[hold(holds)], step=3, epoch=0, uri=path.as_uri())
        wait_for(lambda: (holds / "held-3").exists())
        # WHEN the checkpoint is deleted (save_total_limit) while it is being finished
        path.unlink()
        path.parent.rmdir()
        # (a warning the user sees with logging unconfigured: the finisher's thread raises it)
        with pytest.warns(RuntimeWarning, match="checkpoint of step 3 not reported"):
            release(holds, 3)
            outcome = done.result(timeout=10)
        assert rep.flush(5)
        # THEN it is dropped: a warning, a counter, no report, no job left on disk
        assert outcome.status == "dropped" and "removed" in outcome.reason
        assert rep.stats.finish_dropped == 1 and rep.stats.reported == 0
    assert "checkpoint of step 3 not reported" in caplog.text
    assert _bodies(sqs, url, expect=0) == []
    assert _records(tmp_path / "spool") == []


def test_the_next_save_waits_only_at_the_bound_and_says_so(
    pipeline_queues: PipelineQueues,
    tmp_path: Path,
    holds: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    paths = _checkpoint(tmp_path / "ckpt", {f"step-{i}.bin": 1000 for i in range(3)})
    caplog.set_level(logging.WARNING)
    with _reporter(pipeline_queues.queue_url, tmp_path / "spool", max_finishing=2) as rep:
        # GIVEN two saves in finishing (the bound), the first held
        for i in range(2):
            rep.finish([paths[i]], post=[hold(holds)], step=i, epoch=0, uri=paths[i].as_uri())
        wait_for(lambda: (holds / "held-0").exists())
        # WHEN a third save comes: it waits
        third = threading.Thread(
            target=rep.finish,
            args=([paths[2]],),
            kwargs={"step": 2, "epoch": 0, "uri": paths[2].as_uri()},
        )
        third.start()
        wait_for(lambda: rep.stats.saves_waiting == 1)
        assert third.is_alive() and rep.stats.finish_waits == 0
        # THEN it goes on once a slot is free, and the wait is counted and logged
        release(holds, "all")
        third.join(timeout=10)
        assert not third.is_alive()
        assert rep.flush(10)
        assert rep.stats.finish_waits == 1 and rep.stats.reported == 3
    assert "save of step 2 waited" in caplog.text and "max_finishing=2" in caplog.text


def test_close_keeps_its_deadline_and_the_next_start_finishes_the_job(
    pipeline_queues: PipelineQueues,
    sqs: Any,
    tmp_path: Path,
    holds: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = pipeline_queues.queue_url
    (path,) = _checkpoint(tmp_path / "ckpt", {"step-7.bin": 4096})
    rep = _reporter(url, tmp_path / "spool", run_attempt=0)
    rep.finish([path], checksums=True, post=[hold(holds)], step=7, epoch=1, uri=path.as_uri())
    wait_for(lambda: (holds / "held-7").exists())
    # WHEN closed with the checkpoint still held, with a 0.5 s budget
    start = time.monotonic()
    assert rep.close(timeout=0.5) is False
    # THEN close returned within its budget plus the threads' one-second join floor, and the
    # job is still on disk
    assert time.monotonic() - start < 0.5 + 2 * 1.0 + 1.0
    assert "not finished" in caplog.text
    assert len(_records(tmp_path / "spool")) == 1
    assert _bodies(sqs, url, expect=0) == []
    # WHEN the next attempt starts on the same spool, with the checkpoint released
    release(holds, 7)
    with _reporter(url, tmp_path / "spool", run_attempt=1) as again:
        assert again.flush(10)
    # THEN it is reported once, as the attempt that saved it
    (body,) = _bodies(sqs, url, expect=1)
    assert (body["step"], body["run_attempt"], body["bytes"]) == (7, 0, 4096)
    assert body["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert _records(tmp_path / "spool") == []


def test_a_job_whose_file_changed_before_the_restart_is_dropped_with_a_warning(
    pipeline_queues: PipelineQueues,
    sqs: Any,
    tmp_path: Path,
    holds: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = pipeline_queues.queue_url
    (path,) = _checkpoint(tmp_path / "ckpt", {"last.bin": 4096})
    rep = _reporter(url, tmp_path / "spool")
    rep.finish([path], post=[hold(holds)], step=1, epoch=0, uri=path.as_uri())
    wait_for(lambda: (holds / "held-1").exists())
    rep.close(timeout=0.1)
    # WHEN the file is overwritten with other bytes before the next start
    path.write_bytes(os.urandom(2048))
    release(holds, "all")
    with _reporter(url, tmp_path / "spool") as again:
        assert again.flush(5)
        assert again.stats.finish_dropped == 1
    # THEN the next start drops it with a warning: those bytes were never the saved checkpoint
    assert "files are not intact" in caplog.text
    assert _bodies(sqs, url, expect=0) == []
    assert _records(tmp_path / "spool") == []


def test_finish_refuses_bad_fields_and_missing_files_at_the_call(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    (path,) = _checkpoint(tmp_path, {"a.bin": 10})
    with _reporter(pipeline_queues.queue_url, tmp_path / "spool") as rep:
        with pytest.raises(InvalidMessage, match="step"):
            rep.finish([path], step=-1, epoch=0, uri=path.as_uri())
        with pytest.raises(InvalidMessage, match="bytes"):
            rep.finish([path], step=1, epoch=0, uri=path.as_uri(), bytes=10)
        with pytest.raises(FileNotFoundError):
            rep.finish([tmp_path / "nope.bin"], step=1, epoch=0, uri="file:///nope")
        assert _records(tmp_path / "spool") == [] and rep.stats.finishing == 0


def test_atomic_torch_save_async_shows_the_file_only_once_durable(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path, holds: Path
) -> None:
    url = pipeline_queues.queue_url
    path = tmp_path / "ckpt" / "step-5" / "rank-0.pt"
    with _reporter(url, tmp_path / "spool") as rep:
        # GIVEN the finisher held on an earlier job, so this one waits before its fsync
        (other,) = _checkpoint(tmp_path / "other", {"x.bin": 10})
        rep.finish([other], post=[hold(holds)], step=4, epoch=0, uri=other.as_uri())
        done = atomic_torch_save_async(
            rep, {"w": torch.arange(8.0)}, path, checksums=True, step=5, epoch=0, uri=path.as_uri()
        )
        # THEN the target does not exist yet: only the temp file does
        assert not path.exists() and len(list(path.parent.iterdir())) == 1
        release(holds, "all")
        assert done.result(timeout=10).status == "reported"
        assert rep.flush(10)
    data = path.read_bytes()
    assert [p.name for p in path.parent.iterdir()] == ["rank-0.pt"]
    assert torch.equal(torch.load(path)["w"], torch.arange(8.0))
    body = next(b for b in _bodies(sqs, url, expect=2) if b["step"] == 5)
    assert (body["bytes"], body["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


def test_parallel_hashing_matches_hashlib(tmp_path: Path) -> None:
    paths = _checkpoint(tmp_path, {f"f{i}": n for i, n in enumerate([0, 1, 9_000_000, 123_457])})
    expected = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert sha256_files(paths, threads=3, chunk_bytes=1 << 20) == expected
    assert sha256_files(paths, threads=1) == expected


@pytest.fixture
def silent_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A listening socket that takes requests and never answers (a hung SQS). boto3 gets dummy
    credentials: without them its sender would hang in the credential search instead, or not,
    depending on whether an earlier test on the worker had set them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(30)
    for key, value in local_aws_env(f"http://127.0.0.1:{server.getsockname()[1]}").items():
        monkeypatch.setenv(key, value)
    try:
        yield server
    finally:
        server.close()


def test_close_names_the_sender_thread_that_outlives_its_deadline(
    silent_server: socket.socket, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a reporter whose sender is inside a send that will not return for 30 s
    endpoint = f"http://127.0.0.1:{silent_server.getsockname()[1]}"
    rep = CheckpointReporter(
        f"{endpoint}/123456789012/q.fifo",
        job_id="hung",
        spool_dir=tmp_path,
        rank=0,
        world_size=1,
        endpoint_url=endpoint,
        region="us-east-1",
        read_timeout_s=30.0,
        spot_poll=False,
        install_signal_handler=False,
    )
    rep.report(step=1, epoch=0, uri="s3://b/k")
    # (its request arrived: the sender is past its last look at the stop flag, in the read)
    conn, _ = silent_server.accept()
    conn.settimeout(30)
    with conn:
        assert conn.recv(65536).startswith(b"POST ")
        assert rep.pending == 1
        # WHEN closed with a short budget
        assert rep.close(timeout=0.2) is False
    # THEN a warning names the thread and the deadline it missed
    line = next(r.getMessage() for r in caplog.records if "did not stop" in r.getMessage())
    assert "ckpt-sender-rank-0.spool" in line and "deadline (1.0 s)" in line


@pytest.mark.slow
def test_a_file_list_too_long_for_one_message_is_reported_as_its_count(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    # GIVEN 400 shard files with long names: the names fit the contract's 64 KiB body at
    # finish()'s call, the names with their digests do not
    url = pipeline_queues.queue_url
    sizes = {f"shard-{i:05d}-{'x' * 88}.bin": 16 for i in range(400)}
    files = _checkpoint(tmp_path / "ckpt" / "step-7", sizes)
    with _reporter(url, tmp_path / "spool", post_steps=[]) as rep:
        done = rep.finish(
            files,
            base=files[0].parent,
            checksums=True,
            list_files=True,
            step=7,
            epoch=0,
            uri=files[0].parent.as_uri(),
        )
        # THEN the finisher reports the count instead of the list, with every byte counted
        assert done.result(timeout=300).status == "reported"
        assert rep.flush(10)
    (body,) = _bodies(sqs, url, expect=1)
    assert body["file_count"] == 400 and "files" not in body and "file_sha256" not in body
    assert body["bytes"] == 6_400
