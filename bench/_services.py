"""Services the benchmarks share: moto's SQS server (or LocalStack's) in its own process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ckpt_pipeline.local.sqs_server import SqsKind, sqs_emulator


@contextlib.contextmanager
def sqs_process(kind: SqsKind = "moto") -> Iterator[str]:
    """The chosen SQS emulator (``moto`` or ``localstack``) in its own process; its endpoint.

    SQS is remote in production: in-process, the emulator's request handling would compete for
    the benchmark's GIL and its cost would be charged to the client or the writer.
    """
    with sqs_emulator(kind) as endpoint:
        yield endpoint
