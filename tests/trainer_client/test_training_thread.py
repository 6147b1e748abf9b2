"""The training thread never fsyncs: ``finish()`` writes its job record without one, and the
finisher makes the record durable with the checkpoint. Real reporter, real files, moto's SQS;
``os.fsync``/``os.fdatasync`` are wrapped (they still run) to see which thread calls them. And it
reads nothing from disk: not even the first save of a process imports a module (an audit hook in
a fresh interpreter sees every import and open)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.trainer_client.helpers import drain, run_child
from trainer_client import CheckpointReporter
from trainer_client.torch_integration import atomic_torch_save_async

pytestmark = pytest.mark.slow


class SyncCalls:
    """Every fsync/fdatasync of the process, by the name of the thread that issued it."""

    def __init__(self) -> None:
        self.by_thread: list[str] = []
        self._lock = threading.Lock()

    def wrap(self, call: Callable[[int], None]) -> Callable[[int], None]:
        def counted(fd: int) -> None:
            with self._lock:
                self.by_thread.append(threading.current_thread().name)
            call(fd)

        return counted


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncCalls]:
    calls = SyncCalls()
    monkeypatch.setattr(os, "fsync", calls.wrap(os.fsync))
    monkeypatch.setattr(os, "fdatasync", calls.wrap(os.fdatasync))
    yield calls


@pytest.mark.parametrize("checksums", [False, True])
def test_saves_issue_no_fsync_on_the_training_thread_and_are_still_reported_durable(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path, syncs: SyncCalls, checksums: bool
) -> None:
    url = pipeline_queues.queue_url
    with CheckpointReporter(
        url,
        job_id="no-fsync",
        spool_dir=tmp_path / "spool",
        rank=0,
        world_size=1,
        spot_poll=False,
        install_signal_handler=False,
    ) as rep:
        started = len(syncs.by_thread)
        # WHEN a plain loop saves three times: atomic_torch_save_async, and finish() of a
        # two-file checkpoint directory
        state = {"w": torch.randn(64_000)}
        for step in (1, 2, 3):
            path = tmp_path / "ckpt" / f"step-{step}.pt"
            atomic_torch_save_async(
                rep, state, path, checksums=checksums, step=step, epoch=0, uri=path.as_uri()
            )
            directory = tmp_path / "ckpt" / f"dir-{step}"
            directory.mkdir()
            files = [directory / "model.bin", directory / "optim.bin"]
            for f in files:
                f.write_bytes(os.urandom(50_000))
            rep.finish(
                files,
                base=directory,
                checksums=checksums,
                list_files=True,
                step=100 + step,
                epoch=0,
                uri=directory.as_uri(),
            )
        on_training_thread = [
            t for t in syncs.by_thread[started:] if t == threading.current_thread().name
        ]
        assert rep.flush(30)
    # THEN the training thread issued no fsync while saving; the finisher did them all (the
    # files, their directories, the job records), and every save was reported
    assert on_training_thread == []
    assert any(t.startswith("ckpt-finisher") for t in syncs.by_thread[started:])
    bodies = [json.loads(m["Body"]) for m in drain(sqs, url, expect=6, timeout=10.0)]
    assert sorted(b["step"] for b in bodies) == [1, 2, 3, 101, 102, 103]
    assert all((b["sha256"] is not None) == checksums for b in bodies if b["step"] < 100)
    assert not list((tmp_path / "spool" / "no-fsync" / "rank-0.finishing").glob("*.json"))


# A fresh interpreter (this one has run reports already): a reporter, then one save's finish() of
# a report with metrics and extra fields, every import and open on the training thread meanwhile.
FIRST_SAVE = """
import json, sys, threading
from pathlib import Path
from trainer_client import CheckpointReporter

root, url = Path(sys.argv[1]), sys.argv[2]
directory = root / "ckpt"
directory.mkdir()
(directory / "model.bin").write_bytes(b"m" * 4096)
seen, watching = [], False

def hook(event, args):
    main = threading.current_thread() is threading.main_thread()
    if watching and main and event in ("import", "open"):
        seen.append([event, str(args[0])])

sys.addaudithook(hook)
with CheckpointReporter(
    url, job_id="first-save", spool_dir=root / "spool", rank=0, world_size=1, run_attempt=0,
    spot_poll=False, install_signal_handler=False,
) as rep:
    watching = True
    rep.finish(
        [directory / "model.bin"], base=directory, checksums=True, list_files=True, step=1,
        epoch=0, uri=directory.as_uri(), loss=0.5, metrics={"epoch": 0.5, "lr": 1e-4},
        extra={"framework": "transformers"},
    )
    watching = False
    assert rep.flush(30)
print(json.dumps(seen))
"""


def test_the_first_save_of_a_process_imports_nothing_on_the_training_thread(
    pipeline_queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    # WHEN a fresh process makes its first save through finish()
    child = run_child(FIRST_SAVE, str(tmp_path), pipeline_queues.queue_url, timeout=120)
    assert child.returncode == 0, child.stderr
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    # THEN its training thread imported no module (an import reads a file, which on a disk busy
    # with write-back waited 160 ms, BENCHMARKS.md §8) and opened only its job record
    assert [name for event, name in seen if event == "import"] == []
    opened = [Path(name) for event, name in seen if event == "open"]
    assert [p.parent.name for p in opened] == ["rank-0.finishing"], opened
    assert opened[0].name.endswith(".json.tmp")
    url = pipeline_queues.queue_url
    bodies = [json.loads(m["Body"]) for m in drain(sqs, url, expect=1, timeout=10.0)]
    assert bodies[0]["step"] == 1 and bodies[0]["sha256"] is not None
