"""LocalStack's SQS as a managed local service: it starts healthy, serves the pipeline's queues
at its own address, keeps its files in its own temporary root and leaves nothing running."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from ckpt_pipeline.local.localstack import installed_python, localstack_sqs, sqs_health
from ckpt_pipeline.local.sqs_server import create_pipeline_queues
from ckpt_pipeline.ops.sqs import sqs_client


def _server_environ(port: int) -> dict[str, str] | None:
    """The environment of the process listening as LocalStack's gateway on ``port``."""
    needle = f"GATEWAY_LISTEN=127.0.0.1:{port}".encode()
    for proc in Path("/proc").iterdir():
        try:
            raw = (proc / "environ").read_bytes() if proc.name.isdigit() else b""
        except OSError:
            continue
        if needle in raw.split(b"\0"):
            pairs = (item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)
            return dict(pairs)
    return None


def test_serves_pipeline_queues_at_its_own_address(localstack_endpoint: str) -> None:
    assert sqs_health(localstack_endpoint) == "running"
    queues = create_pipeline_queues(
        sqs_client(localstack_endpoint), prefix=f"ls{uuid.uuid4().hex[:8]}"
    )
    # Queue URLs name the endpoint itself: no DNS for *.localhost.localstack.cloud needed.
    assert queues.queue_url.startswith(localstack_endpoint + "/")
    assert queues.dlq_url.startswith(localstack_endpoint + "/")


@pytest.mark.skipif(
    installed_python() is None and not os.environ.get("CI"), reason="LocalStack not installed"
)
def test_runs_in_its_own_temp_root_and_stop_leaves_nothing(tmp_path: Path) -> None:
    log = tmp_path / "ls.log"
    with localstack_sqs(log_path=log) as endpoint:
        port = int(endpoint.rsplit(":", 1)[1])
        env = _server_environ(port)
        assert env is not None, "the gateway process is found by its listen address"
        root = Path(env["FILESYSTEM_ROOT"])
        # Its files live in this run's own directory, not in a /var/lib/localstack of all runs.
        assert root.is_dir() and root.is_relative_to(Path(env["HOME"]))
        assert env["OVERRIDE_IN_DOCKER"] == "0"
    assert sqs_health(endpoint) is None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        pass
    assert _server_environ(port) is None, "the whole process group is gone"
    assert not root.exists(), "the temporary root is removed"
    assert "Ready." in log.read_text()
