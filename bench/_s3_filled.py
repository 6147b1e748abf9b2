"""moto's S3 server in a process of its own, with checkpoints already in it (bench setup only).

The objects are put through moto's own backend before it listens (PUTting 100,000 over HTTP
takes minutes); each body is derived from its key (``body``), so every ETag is known. Run by
``filled_s3_process`` (``python -m bench._s3_filled PORT SPEC_JSON``: ``ready`` once it listens,
serves until stdin closes); ``put_over_http`` fills a server the bench does not own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

_START_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Fill:
    """``count`` DCP shards ``<prefix>__<rank>_0.distcp`` and a ``.metadata`` in ``bucket``."""

    bucket: str
    prefix: str
    count: int

    def object_keys(self) -> list[str]:
        return [f"{self.prefix}__{r}_0.distcp" for r in range(self.count)] + [
            f"{self.prefix}.metadata"
        ]


def body(key: str) -> bytes:
    """The 16 bytes stored at ``key``."""
    return hashlib.sha256(key.encode()).digest()[:16]


def etag(key: str) -> str:
    """S3's ETag of :func:`body` (a single-part PUT without SSE-KMS: the MD5 of the bytes)."""
    return '"' + hashlib.md5(body(key)).hexdigest() + '"'


@contextlib.contextmanager
def filled_s3_process(fills: Sequence[Fill]) -> Iterator[tuple[str, int]]:
    """The server for the block: its endpoint URL and its process id (whose CPU a bench reads)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = json.dumps([asdict(f) for f in fills])
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench._s3_filled", str(port), spec],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # moto's request log
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        line = proc.stdout.readline()
        if line.strip() != "ready" or time.monotonic() > deadline:
            raise RuntimeError(f"the filled S3 server did not start: {line!r}")
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def put_over_http(client: Any, fills: Sequence[Fill], *, workers: int) -> list[Fill]:
    """PUT ``fills`` into a running S3 server (LocalStack's), ``workers`` at a time; a fill whose
    ``.metadata`` (PUT last) is there already is skipped. Returns the fills PUT now."""
    from botocore.exceptions import ClientError

    done = []
    for fill in fills:
        keys = fill.object_keys()
        try:
            client.head_object(Bucket=fill.bucket, Key=keys[-1])
            continue
        except ClientError:
            pass
        with contextlib.suppress(ClientError):
            client.create_bucket(Bucket=fill.bucket)
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda k, b=fill.bucket: client.put_object(Bucket=b, Key=k, Body=body(k)),
                          keys[:-1]))  # fmt: skip
        client.put_object(Bucket=fill.bucket, Key=keys[-1], Body=body(keys[-1]))
        done.append(fill)
    return done


def _serve(port: int, fills: Sequence[Fill]) -> None:
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for fill in fills:
        if fill.bucket not in backend.buckets:
            backend.create_bucket(fill.bucket, "us-east-1")
        for key in fill.object_keys():
            backend.put_object(fill.bucket, key, body(key), disable_notification=True)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the bench closes it
    server.stop()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), [Fill(**f) for f in json.loads(sys.argv[2])])
