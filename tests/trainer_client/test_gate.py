"""The disk gate: the sender steps aside while a report() is in progress; report() never waits.

Behaviour, not timing: where the sender stops (which botocore events it has reached), what has
reached the queue, and that report() returns while the sender is parked or stuck in a send.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.trainer_client.helpers import drain, wait_for
from trainer_client import CheckpointReporter
from trainer_client.report._gate import DiskGate

# Long enough that a parked sender stays parked for the whole test: its bound is not under test.
_NEVER_S = 60.0


def _start(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_checkpoint_waits_while_closed_and_passes_once_opened() -> None:
    gate = DiskGate(max_wait_s=_NEVER_S)
    passed = threading.Event()

    def sender() -> None:
        gate.checkpoint()
        passed.set()

    # GIVEN an open gate, a checkpoint passes straight through
    gate.checkpoint()
    # WHEN a report() is inside (the gate is closed, even twice: two reporting threads)
    with gate.closed(), gate.closed():
        thread = _start(sender)
        wait_for(lambda: gate.parked == 1)
        # THEN the sender waits there, however often the gate is closed and opened around it
        with gate.closed():
            pass
        assert not passed.is_set() and gate.is_closed
    # AND goes on once the last one leaves
    thread.join(10)
    assert passed.is_set() and gate.parked == 0 and not gate.is_closed


def test_reports_back_to_back_cannot_hold_the_sender_beyond_the_bound() -> None:
    gate = DiskGate(max_wait_s=0.01)
    with gate.closed():
        thread = _start(gate.checkpoint)
        thread.join(10)
        # The gate never opened, yet the sender went on: a closed gate delays, never starves.
        assert not thread.is_alive()


@pytest.fixture
def reporter(pipeline_queues: PipelineQueues, tmp_path: Path) -> Iterator[CheckpointReporter]:
    with CheckpointReporter(
        pipeline_queues.queue_url,
        job_id="gate-job",
        spool_dir=tmp_path,
        rank=0,
        world_size=1,
        spot_poll=False,
        install_signal_handler=False,
    ) as rep:
        rep._gate.max_wait_s = _NEVER_S
        rep.report(step=0, epoch=0, uri="s3://b/0")  # warm: the first send opens a connection
        assert rep.flush(20)
        yield rep


def _events(rep: CheckpointReporter) -> Any:
    return rep._sender._client.meta.events


def test_the_sender_does_not_progress_through_a_send_while_a_report_is_on_disk(
    reporter: CheckpointReporter, pipeline_queues: PipelineQueues, sqs: Any
) -> None:
    rep = reporter
    in_send, resume = threading.Event(), threading.Event()
    requests_sent: list[int] = []

    def hold(**_: Any) -> None:
        in_send.set()
        resume.wait(20)

    # Registered after the gate's handlers (which go first) and after the signer: the sender
    # stops here with its request built and signed, and before-send records an HTTP request
    # only once the sender has passed the before-send checkpoint.
    _events(rep).register("request-created.sqs", hold)
    _events(rep).register("before-send.sqs", lambda **_: requests_sent.append(1))

    real_append = rep._spool.append
    disk_busy, on_disk = threading.Event(), threading.Event()

    def slow_append(body: str, **kw: Any) -> int:
        # Report 2's write + fsync takes as long as the test wants (a slow disk).
        if json.loads(body)["step"] == 2:
            disk_busy.set()
            on_disk.wait(20)
        return real_append(body, **kw)

    rep._spool.append = slow_append  # type: ignore[method-assign]

    # GIVEN the sender in the middle of sending report 1 (request signed, not yet sent)
    rep.report(step=1, epoch=0, uri="s3://b/1")
    assert in_send.wait(20)
    # WHEN report 2 is on disk (slowly) in another thread and the sender resumes
    slow = _start(lambda: rep.report(step=2, epoch=0, uri="s3://b/2"))
    assert disk_busy.wait(20)
    resume.set()
    # THEN it stops at its next checkpoint, before the request goes out
    wait_for(lambda: rep._gate.parked == 1)
    assert requests_sent == [] and rep.stats.sent == 1 and rep.pending == 1
    # AND meanwhile report() still returns at once (it never waits for the sender)
    rep.report(step=3, epoch=0, uri="s3://b/3")
    assert rep.pending == 2 and rep._gate.parked == 1 and requests_sent == []
    # WHEN report 2 is on disk, the sender goes on: everything arrives, once
    on_disk.set()
    slow.join(20)
    assert rep.flush(20)
    assert requests_sent and rep.stats.sent == 4
    steps = [json.loads(m["Body"])["step"] for m in drain(sqs, pipeline_queues.queue_url, expect=4)]
    assert sorted(steps) == [0, 1, 2, 3]


def test_report_never_waits_for_a_sender_stuck_in_a_send(reporter: CheckpointReporter) -> None:
    rep = reporter
    stuck, unstick = threading.Event(), threading.Event()

    def hang(**_: Any) -> None:  # None: botocore would take any other value as the response
        stuck.set()
        unstick.wait(20)

    # The sender hangs inside a send, past every checkpoint before the request (a slow network).
    _events(rep).register("before-send.sqs", hang)
    try:
        rep.report(step=1, epoch=0, uri="s3://b/1")
        assert stuck.wait(20)
        # WHEN reports arrive while it is stuck, from two threads at once
        other = _start(lambda: [rep.report(step=s, epoch=0, uri=f"s3://b/{s}") for s in (2, 3)])
        for step in (4, 5):
            rep.report(step=step, epoch=0, uri=f"s3://b/{step}")
        other.join(20)
        # THEN each returned with its report on disk, the sender still stuck
        assert not other.is_alive() and stuck.is_set() and not unstick.is_set()
        assert rep.pending == 5 and not rep._gate.is_closed
    finally:
        unstick.set()
    assert rep.flush(20)
