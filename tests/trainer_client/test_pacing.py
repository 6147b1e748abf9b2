"""The finisher's pacing knobs on a real reporter: the bandwidth cap, the pause while a training
step is in flight, the write-back in slices, the idle cores; real files, moto's SQS."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench._writeback import cached_pages
from ckpt_pipeline.local.sqs_server import PipelineQueues
from trainer_client import CheckpointReporter
from trainer_client.finish._pacing import (
    MAX_AUTO_HASH_THREADS,
    IdleCores,
    lower_thread_priority,
    thread_nice,
)
from trainer_client.storage.durable import fsync_in_slices

MIB = 1024 * 1024


def _reporter(queue_url: str, spool: Path, **tuning: Any) -> CheckpointReporter:
    return CheckpointReporter(
        queue_url,
        job_id="pace",
        spool_dir=spool,
        rank=0,
        world_size=1,
        spot_poll=False,
        install_signal_handler=False,
        **tuning,
    )


def test_the_bandwidth_cap_spreads_write_back_and_hashing(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    # GIVEN a 1 MiB checkpoint, written back in 256 KiB slices and hashed, capped at 1 MiB/s
    path = tmp_path / "ckpt.bin"
    path.write_bytes(os.urandom(MIB))
    with _reporter(
        pipeline_queues.queue_url,
        tmp_path / "spool",
        max_bandwidth=float(MIB),
        writeback_slice_bytes=256 * 1024,
    ) as rep:
        start = time.monotonic()
        outcome = rep.finish([path], checksums=True, step=1, epoch=0, uri=path.as_uri())
        # THEN 2 MiB went through the finisher (1 written back, 1 read to hash): not before 2 s,
        # and the outcome says where the time went: about a second each making it durable and
        # hashing it
        assert outcome.result(timeout=30).status == "reported"
        assert time.monotonic() - start >= 1.9
        seconds = outcome.result().seconds
        assert set(seconds) == {"queued", "durable", "hash", "post", "report"}
        assert seconds["durable"] >= 0.7 and seconds["hash"] >= 0.7, seconds
        report = outcome.result().report
        assert report is not None
        assert report.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_step_in_flight_holds_the_finisher_up_to_step_pause_s(
    pipeline_queues: PipelineQueues, tmp_path: Path
) -> None:
    path = tmp_path / "ckpt.bin"
    path.write_bytes(os.urandom(64 * 1024))
    with _reporter(pipeline_queues.queue_url, tmp_path / "spool", step_pause_s=30.0) as rep:
        # GIVEN a training step in flight (as the HF and Lightning hooks say)
        rep.step_began()
        outcome = rep.finish([path], checksums=True, step=1, epoch=0, uri=path.as_uri())
        # THEN the finisher waits for it; WHEN the step ends, the checkpoint is reported
        time.sleep(1.0)
        assert not outcome.done()
        rep.step_ended()
        assert outcome.result(timeout=10).status == "reported"


def test_write_back_in_slices_ends_in_a_durable_file(tmp_path: Path) -> None:
    # GIVEN a 3.5 MiB file written back 1 MiB at a time
    path = tmp_path / "f.bin"
    data = os.urandom(3 * MIB + MIB // 2)
    path.write_bytes(data)
    slices: list[int] = []
    fsync_in_slices(path, MIB, slices.append)
    # THEN every byte went through one slice, the last one shorter
    assert slices == [MIB, MIB, MIB, MIB // 2]
    assert path.read_bytes() == data


def test_idle_cores_and_priorities_are_measured_and_set_on_this_machine() -> None:
    cores = IdleCores()
    time.sleep(0.2)
    assert 1 <= cores.take() <= MAX_AUTO_HASH_THREADS
    seen: dict[str, int] = {}

    def lowered() -> None:
        lower_thread_priority("idle", 0)
        seen["policy"] = os.sched_getscheduler(threading.get_native_id())

    thread = threading.Thread(target=lowered)
    thread.start()
    thread.join()
    # THEN the idle priority applies to that thread only
    assert seen["policy"] == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE


def test_low_priority_is_the_trainings_nice_plus_finisher_nice_in_every_finisher_thread() -> None:
    # GIVEN the training's nice, and a finisher thread that lowers itself by 5 and then starts a
    # hash thread (which inherits the finisher's nice, as Linux threads do) lowering itself too
    base = thread_nice()
    seen: dict[str, int] = {}

    def hasher() -> None:
        lower_thread_priority("low", 5, base)
        seen["hash"] = thread_nice()

    def finisher() -> None:
        lower_thread_priority("low", 5, base)
        seen["finisher"] = thread_nice()
        child = threading.Thread(target=hasher)
        child.start()
        child.join()

    thread = threading.Thread(target=finisher)
    thread.start()
    thread.join()
    # THEN both run at the training's nice + 5 (not the hash thread at + 10), the training's own
    # thread unchanged
    assert seen == {"finisher": min(19, base + 5), "hash": min(19, base + 5)}
    assert thread_nice() == base


@pytest.mark.skipif(sys.platform != "linux", reason="cachestat: Linux 6.5+")
@pytest.mark.parametrize("drop", [True, False])
def test_a_finished_checkpoint_gives_its_pages_back_unless_told_not_to(
    pipeline_queues: PipelineQueues, tmp_path: Path, drop: bool
) -> None:
    # GIVEN a checkpoint just written, all of it in the page cache
    path = tmp_path / "ckpt.bin"
    path.write_bytes(os.urandom(8 * MIB))
    pages = (8 * MIB) // os.sysconf("SC_PAGE_SIZE")
    assert cached_pages(path) == pages
    with _reporter(pipeline_queues.queue_url, tmp_path / "spool", drop_page_cache=drop) as rep:
        # WHEN it is finished and reported
        outcome = rep.finish([path], checksums=True, step=1, epoch=0, uri=path.as_uri())
        assert outcome.result(timeout=30).status == "reported"
        rep.flush(10)
    # THEN its clean pages left the cache (the default), or stayed (drop_page_cache=False)
    assert cached_pages(path) == (0 if drop else pages)
