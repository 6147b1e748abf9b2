"""LocalStack's SQS provider as a local service: start on a free loopback port, wait, stop.

moto is the light default; LocalStack's own SQS provider (``localstack-core``, host mode, no
Docker) is the faithful one where fidelity or scale matter: its send does not slow with queue
depth, it keeps a deduplication id for the 5-minute window after a delete, and it implements
``StartMessageMoveTask``. It needs Python 3.13, so it lives in its own venv built by
``.ci/setup-localstack.sh`` (``make localstack``) and runs as a separate process.

Every start gets its own temporary filesystem root (``FILESYSTEM_ROOT``, ``TMPDIR``,
``LOCALSTACK_VOLUME_DIR``), so runs share nothing on disk; ``OVERRIDE_IN_DOCKER=0`` because
LocalStack takes this machine (``/.dockerenv``) for its own container and would otherwise use
``/var/lib/localstack``. The process runs in its own session and its process group is killed on
exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ckpt_pipeline.exceptions import LocalStackUnavailable
from ckpt_pipeline.local.ports import free_loopback_port

VENV_VAR = "CKPT_LOCALSTACK_VENV"
DEFAULT_VENV = Path("/var/cache/ckpt-pipeline/venv-localstack")
# Written by .ci/setup-localstack.sh once the venv is complete (a half-built venv has none).
MARKER = ".ckpt-installed"
SETUP_HINT = "run `make localstack` (.ci/setup-localstack.sh) to install it"
_START_ATTEMPTS = 3
_STOP_GRACE_S = 10.0


def venv_dir() -> Path:
    """Where the LocalStack venv is (``CKPT_LOCALSTACK_VENV`` overrides the cache path)."""
    return Path(os.environ.get(VENV_VAR) or DEFAULT_VENV)


def installed_python() -> Path | None:
    """The LocalStack venv's interpreter, or None if the venv is missing or incomplete."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    return python if (venv / MARKER).is_file() and python.exists() else None


def server_env(root: Path, port: int, services: str = "sqs") -> dict[str, str]:
    """LocalStack's configuration: ``services`` only (SQS by default), on ``port``, everything on
    disk under ``root``."""
    host = f"127.0.0.1:{port}"
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "TMPDIR": str(root / "tmp"),
        "FILESYSTEM_ROOT": str(root / "fs"),
        "LOCALSTACK_VOLUME_DIR": str(root / "volume"),
        "OVERRIDE_IN_DOCKER": "0",
        "SERVICES": services,
        "EAGER_SERVICE_LOADING": "1",
        "GATEWAY_LISTEN": host,
        # Queue URLs name this address (the default names *.localhost.localstack.cloud, which
        # needs DNS); the path strategy keeps the region in the URL.
        "LOCALSTACK_HOST": host,
        "SQS_ENDPOINT_STRATEGY": "path",
        # No DNS server on port 53 (two instances would collide), no analytics, no downloads.
        "DNS_ADDRESS": "0",
        "DISABLE_EVENTS": "1",
        "SKIP_SSL_CERT_DOWNLOAD": "1",
        "SQS_DISABLE_CLOUDWATCH_METRICS": "1",
        "PERSISTENCE": "0",
    }


def sqs_health(endpoint: str, timeout_s: float = 1.0, service: str = "sqs") -> str | None:
    """The ``service`` (SQS) entry of ``/_localstack/health`` ("running", "available", ...), None
    if no answer."""
    try:
        with urllib.request.urlopen(f"{endpoint}/_localstack/health", timeout=timeout_s) as resp:
            services = json.load(resp).get("services", {})
    except (OSError, urllib.error.URLError, ValueError):
        return None
    state = services.get(service)
    return str(state) if state is not None else None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (its own session), SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_STOP_GRACE_S)
    # Children (if any) outlive a leader that exited: the group goes either way.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_healthy(
    proc: subprocess.Popen[bytes], endpoint: str, timeout_s: float, service: str = "sqs"
) -> bool:
    """True once ``service`` (each of a comma-separated list) is up; False if the process exited
    first (lost the port race)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if all(
            sqs_health(endpoint, service=one) in ("running", "available")
            for one in service.split(",")
        ):
            return True
        time.sleep(0.1)
    raise LocalStackUnavailable(
        f"LocalStack {service} at {endpoint} not healthy after {timeout_s:.0f} s"
    )


@contextlib.contextmanager
def localstack_sqs(
    *,
    port: int | None = None,
    startup_timeout_s: float = 90.0,
    log_path: Path | None = None,
    service: str = "sqs",
) -> Iterator[str]:
    """Run LocalStack's SQS (or other services: ``s3``, ``sqs,s3``) on loopback for the block;
    yields its endpoint URL.

    ``port`` defaults to a free one (retried if another process takes it first). The server's
    log goes to ``log_path`` (default: inside its temporary root, quoted if the start fails).
    """
    python = installed_python()
    if python is None:
        raise LocalStackUnavailable(f"LocalStack is not installed at {venv_dir()}: {SETUP_HINT}")
    with tempfile.TemporaryDirectory(prefix="ckpt-localstack-") as tmp:
        root = Path(tmp)
        (root / "tmp").mkdir()
        log = log_path or root / "localstack.log"
        for attempt in range(1, _START_ATTEMPTS + 1):
            bound = port or free_loopback_port()
            endpoint = f"http://127.0.0.1:{bound}"
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    [str(python), "-m", "localstack.runtime.main"],
                    env=server_env(root, bound, service),
                    cwd=root,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                healthy = _wait_healthy(proc, endpoint, startup_timeout_s, service)
            except BaseException:
                _stop(proc)
                raise
            if healthy:
                break
            _stop(proc)
            if port is not None or attempt == _START_ATTEMPTS:
                raise LocalStackUnavailable(
                    f"LocalStack exited during start (exit {proc.returncode}):\n{_tail(log)}"
                )
        try:
            yield endpoint
        finally:
            _stop(proc)
