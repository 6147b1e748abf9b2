"""Scenario 2: SIGTERM and a Spot notice (fake IMDS on loopback) with reports pending."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ckpt_pipeline.local.pipeline import LocalPipeline
from ckpt_pipeline.local.tcp_relay import TcpRelay
from tests.e2e.children import start_rank, wait_line
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle, shard_uri
from tests.e2e.matrix import FaultMatrix, FaultRow
from tests.e2e.oracle import SentReport, check_database, expected_state
from tests.trainer_client.test_spot import NOTICE, FakeImds, _handler

pytestmark = pytest.mark.slow


@contextmanager
def _fake_imds() -> Iterator[tuple[FakeImds, str]]:
    state = FakeImds()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _sqs_relay(pipeline: LocalPipeline) -> TcpRelay:
    """A cut-able path from the rank processes to SQS (the writer's own path stays up)."""
    parts = urlsplit(pipeline.endpoint_url)
    assert parts.hostname is not None and parts.port is not None
    return TcpRelay((parts.hostname, parts.port))


def _hold_args(pipeline: LocalPipeline, relay: TcpRelay, job: str, rank: int, spool: Path) -> Any:
    return {
        "mode": "hold",
        "queue_url": pipeline.queues.queue_url,
        "endpoint_url": relay.url_for(),
        "job_id": job,
        "rank": rank,
        "world_size": 2,
        "spool_dir": str(spool),
        "steps": 4,
    }


def test_sigterm_with_pending_reports_flushes_then_dies_of_sigterm(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path
) -> None:
    job = "e2e-sigterm"
    with pipeline_factory() as pipeline:
        relay = _sqs_relay(pipeline)  # not started: SQS unreachable for the ranks
        tuning = {"connect_timeout_s": 0.3, "backoff_base_s": 0.05, "backoff_cap_s": 0.3}
        procs = [
            start_rank(
                {**_hold_args(pipeline, relay, job, rank, tmp_path), "tuning": tuning},
                env=pipeline.client_env(),
                log=tmp_path / f"rank-{rank}.log",
            )
            for rank in range(2)
        ]
        # GIVEN two ranks holding 4 unsent reports each (their sends fail)
        for proc in procs:
            assert wait_line(proc, "pending") == "pending 4"
        # WHEN torchrun sends SIGTERM while SQS is still unreachable, and SQS returns later
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # hold the outage open: the ranks must keep flushing, not exit
        still_flushing = [proc.poll() is None for proc in procs]
        relay.start()
        try:
            codes = [proc.wait(timeout=30) for proc in procs]
            stats = settle(pipeline)
        finally:
            relay.stop()
        dlq = pipeline.dlq_depth()

    sent = [SentReport(job, s, r, 0, 2, shard_uri(job, s, r)) for s in range(4) for r in range(2)]
    check = check_database(pipeline.database_url, expected_state(sent))
    fault_matrix.record(
        FaultRow.of(
            "2a SIGTERM with pending reports",
            reports_sent=len(sent),
            check=check,
            in_dlq=dlq,
            exit_codes=codes,
            deliveries=stats.records,
        )
    )
    # THEN they flushed during the grace period, then died of the chained SIGTERM (SIG_DFL)
    assert still_flushing == [True, True]
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]
    assert check.problems == []
    assert check.complete_found == 4
    assert dlq == 0


def test_spot_notice_flushes_pending_reports(
    pipeline_factory: PipelineFactory, fault_matrix: FaultMatrix, tmp_path: Path
) -> None:
    job = "e2e-spot"
    with pipeline_factory() as pipeline, _fake_imds() as (imds, imds_url):
        relay = _sqs_relay(pipeline)
        # A 600 s backoff: without the notice the reports would wait that long after SQS is back.
        tuning = {
            "connect_timeout_s": 0.3,
            "backoff_base_s": 600,
            "backoff_cap_s": 600,
            "spot_poll_interval_s": 0.05,
        }
        procs = [
            start_rank(
                {
                    **_hold_args(pipeline, relay, job, rank, tmp_path),
                    "tuning": tuning,
                    "spot_poll": True,
                },
                env={**pipeline.client_env(), "CKPT_IMDS_ENDPOINT": imds_url},
                log=tmp_path / f"rank-{rank}.log",
            )
            for rank in range(2)
        ]
        # GIVEN two ranks whose reports are pending after failed sends, SQS back meanwhile
        for proc in procs:
            assert wait_line(proc, "pending") == "pending 4"
        relay.start()
        try:
            # WHEN the 2-minute interruption notice appears on IMDS
            imds.notice = NOTICE
            flushed = [wait_line(proc, "spot-flushed", timeout=30) for proc in procs]
            # ... and the instance shuts down (SIGTERM)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            codes = [proc.wait(timeout=30) for proc in procs]
            stats = settle(pipeline)
        finally:
            relay.stop()
        dlq = pipeline.dlq_depth()

    sent = [SentReport(job, s, r, 0, 2, shard_uri(job, s, r)) for s in range(4) for r in range(2)]
    check = check_database(pipeline.database_url, expected_state(sent))
    fault_matrix.record(
        FaultRow.of(
            "2b Spot notice (fake IMDS) with pending reports",
            reports_sent=len(sent),
            check=check,
            in_dlq=dlq,
            exit_codes=codes,
            imds_unauthorised=imds.unauthorised,
            deliveries=stats.records,
        )
    )
    # THEN the notice flushed everything at once, and SIGTERM still ends the process as SIGTERM
    assert flushed == ["spot-flushed 0", "spot-flushed 0"]
    assert codes == [-signal.SIGTERM, -signal.SIGTERM]
    assert imds.unauthorised == 0
    assert check.problems == []
    assert check.complete_found == 4
    assert dlq == 0
