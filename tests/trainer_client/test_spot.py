"""A fake IMDSv2 on loopback announces a Spot interruption: the reporter flushes at once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.trainer_client.helpers import RestartableMoto, drain, wait_for
from trainer_client import CheckpointReporter

TOKEN = "fake-imds-token"
NOTICE = {"action": "terminate", "time": "2026-12-02T15:00:00Z"}


class FakeImds:
    """State of the fake metadata service: the notice, once set, and the requests seen."""

    def __init__(self) -> None:
        self.notice: dict[str, str] | None = None
        self.token_ttls: list[str] = []
        self.unauthorised = 0


def _handler(state: FakeImds) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            if self.path != "/latest/api/token":
                return self._reply(404, b"")
            self.token_ttls.append(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
            return self._reply(200, TOKEN.encode())

        def do_GET(self) -> None:
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                state.unauthorised += 1
                return self._reply(401, b"")
            if self.path != "/latest/meta-data/spot/instance-action" or state.notice is None:
                return self._reply(404, b"Not Found")
            return self._reply(200, json.dumps(state.notice).encode())

        @property
        def token_ttls(self) -> list[str]:
            return state.token_ttls

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def imds(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeImds]:
    """The fake IMDS on a loopback port, announced through ``CKPT_IMDS_ENDPOINT``."""
    state = FakeImds()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("CKPT_IMDS_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_spot_interruption_notice_flushes_now(
    imds: FakeImds, moto_down: tuple[RestartableMoto, Any, Any], tmp_path: Path
) -> None:
    moto, queues, sqs = moto_down
    # GIVEN reports stuck behind a long backoff (SQS was down, now back) and IMDS saying nothing
    with CheckpointReporter(
        queues.queue_url,
        job_id="spot-job",
        spool_dir=tmp_path,
        rank=0,
        world_size=1,
        endpoint_url=moto.endpoint,
        connect_timeout_s=0.2,
        backoff_base_s=600,
        backoff_cap_s=600,
        spot_poll_interval_s=0.05,
    ) as rep:  # spot polling is on because CKPT_IMDS_ENDPOINT is set
        rep.report(step=1, epoch=0, uri="s3://b/1")
        rep.report(step=2, epoch=0, uri="s3://b/2")
        wait_for(lambda: rep.last_error is not None)
        moto.start()
        wait_for(lambda: len(imds.token_ttls) >= 1)
        assert rep.pending == 2 and rep.spot_interruption is None
        # WHEN the 2-minute interruption notice appears
        imds.notice = NOTICE
        # THEN the reporter flushes right away instead of waiting out its backoff
        wait_for(lambda: rep.pending == 0, timeout=10)
        assert rep.spot_interruption == NOTICE
    assert imds.token_ttls[0] == "21600" and imds.unauthorised == 0
    assert len(drain(sqs, queues.queue_url, expect=2)) == 2
