"""The SQS emulator alone, no spool and no writer: a bare client sends real report bodies and
drains them (receive 10, delete them in a batch: the event source's shape). What the emulator
costs by itself, the floor under the pipeline's figures: the fan-in's time for the same messages
and the lag curve's ceiling rate."""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench._cpu import listening_pid, process_cpu_s
from bench._reports import report, send_entry
from ckpt_contract import CheckpointReport
from ckpt_pipeline.local.sqs_server import create_pipeline_queues
from ckpt_pipeline.ops.sqs import sqs_client


class _Emulator:
    """A fresh queue pair on the emulator at ``endpoint``, and the emulator process's CPU."""

    def __init__(self, endpoint: str, prefix: str) -> None:
        self.sqs: Any = sqs_client(endpoint)
        self.queue_url = create_pipeline_queues(
            self.sqs, prefix=f"{prefix}-{uuid.uuid4().hex[:8]}"
        ).queue_url
        self._pid = listening_pid(int(endpoint.rsplit(":", 1)[1]))
        self._cpu0 = process_cpu_s(self._pid) if self._pid else 0.0

    def cpu_s(self) -> float:
        """The emulator's CPU seconds since this queue was made (NaN if its process is unseen)."""
        return process_cpu_s(self._pid) - self._cpu0 if self._pid else math.nan

    def send(self, rep: CheckpointReport) -> None:
        self.sqs.send_message_batch(QueueUrl=self.queue_url, Entries=[send_entry(rep)])

    def drain(self, done: Callable[[], bool], deleted: Callable[[int], None]) -> None:
        """Receive up to 10, delete them in one batch, until ``done()``; ``deleted(n)`` after
        each delete."""
        while not done():
            msgs = self.sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            if msgs:
                self.sqs.delete_message_batch(
                    QueueUrl=self.queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                             for i, m in enumerate(msgs)],
                )  # fmt: skip
                deleted(len(msgs))


class _Count:
    def __init__(self) -> None:
        self.n, self.at, self._lock = 0, 0.0, threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.n += n
            self.at = time.monotonic()  # the last delete, not a consumer's idle poll after it


def floor(
    endpoint: str, reports: list[CheckpointReport], *, threads: int = 64
) -> tuple[float, float]:
    """(seconds, emulator CPU seconds) to send ``reports`` (one ``SendMessageBatch`` each, from
    ``threads`` threads, as the reporters send them) and then drain them all (2 consumers)."""
    emu = _Emulator(endpoint, "floor")
    count = _Count()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(emu.send, reports))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        done = lambda: count.n >= len(reports)  # noqa: E731
        for f in [pool.submit(emu.drain, done, count.add) for _ in range(2)]:
            f.result()
    return count.at - started, emu.cpu_s()


def ceiling(
    endpoint: str, *, seconds: float = 10.0, senders: int = 8, consumers: int = 2, ranks: int = 50
) -> tuple[float, float]:
    """(messages deleted per second, emulator CPU seconds per message), closed loop: ``senders``
    threads send as fast as the emulator answers, ``consumers`` threads drain (concurrency 2)."""
    emu = _Emulator(endpoint, "ceiling")
    stop = threading.Event()
    count = _Count()

    def send(worker: int) -> None:
        for step in itertools.count():
            if stop.is_set():
                return
            emu.send(report("ceiling", step, (worker + step * senders) % ranks, ranks))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    threads += [threading.Thread(target=emu.drain, args=(stop.is_set, count.add))
                for _ in range(consumers)]  # fmt: skip
    for t in threads:
        t.start()
    time.sleep(1.0)  # warm-up: connections made, queue in steady state
    first, started = count.n, time.monotonic()
    time.sleep(seconds)
    measured, elapsed = count.n - first, time.monotonic() - started
    stop.set()
    for t in threads:
        t.join()
    return measured / elapsed, emu.cpu_s() / max(1, count.n)
