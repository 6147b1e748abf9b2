"""The SQS emulator's bare ceiling: how many messages per second it takes in, hands out and
deletes with no spool, no event source and no writer (the lag curve's ratio)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime

from bench._cpu import listening_pid, process_cpu_s
from ckpt_contract.message import CheckpointReport, encode
from ckpt_pipeline.local.sqs_server import create_pipeline_queues
from ckpt_pipeline.ops.sqs import sqs_client


def bare_ceiling(
    endpoint: str, *, seconds: float = 10.0, senders: int = 8, consumers: int = 2, ranks: int = 50
) -> tuple[float, float]:
    """(messages deleted per second, emulator CPU seconds per message), closed loop.

    ``senders`` threads send one-entry ``SendMessageBatch`` calls of real report bodies (as a
    reporter at a steady rate does), ``consumers`` threads receive 10 and delete them in a batch
    (the event source's shape at concurrency 2), all as fast as the emulator answers.
    """
    sqs = sqs_client(endpoint)
    q = create_pipeline_queues(sqs, prefix=f"ceil-{uuid.uuid4().hex[:8]}")
    stop = threading.Event()
    deleted = [0]
    lock = threading.Lock()
    now = datetime.now(UTC)

    def send(worker: int) -> None:
        step = 0
        while not stop.is_set():
            rank = (worker + step * senders) % ranks
            rep = CheckpointReport.create(
                job_id="ceiling", run_attempt=0, step=step, epoch=0, world_size=ranks,
                rank=rank, uri=f"file:///ceiling/{step}/{rank}", loss=0.5, created_at=now,
            )  # fmt: skip
            sqs.send_message_batch(
                QueueUrl=q.queue_url,
                Entries=[{"Id": "0", "MessageBody": encode(rep), "MessageGroupId": rep.group_id,
                          "MessageDeduplicationId": f"{worker}-{step}"}],
            )  # fmt: skip
            step += 1

    def consume() -> None:
        while not stop.is_set():
            msgs = sqs.receive_message(
                QueueUrl=q.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            if msgs:
                sqs.delete_message_batch(
                    QueueUrl=q.queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                             for i, m in enumerate(msgs)],
                )  # fmt: skip
                with lock:
                    deleted[0] += len(msgs)

    pid = listening_pid(int(endpoint.rsplit(":", 1)[1]))
    cpu0 = process_cpu_s(pid) if pid else 0.0
    threads = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    threads += [threading.Thread(target=consume) for _ in range(consumers)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # warm-up: connections made, queue in steady state
    with lock:
        start_count = deleted[0]
    started = time.monotonic()
    time.sleep(seconds)
    with lock:
        count = deleted[0] - start_count
    elapsed = time.monotonic() - started
    stop.set()
    for t in threads:
        t.join()
    cpu = (process_cpu_s(pid) - cpu0) if pid else float("nan")
    total = max(1, deleted[0])
    return count / elapsed, cpu / total
