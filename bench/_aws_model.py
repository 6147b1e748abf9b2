"""The AWS drain model of one checkpoint barrier: SQS's quotas, the event source, and the
writers' measured cost (bench.capacity measures it, this module turns it into seconds on AWS)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Lambda's SQS event source: "For FIFO queues, the maximum is 10" (BatchSize), and "Batching window
# is not supported for FIFO queues":
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-parameters.html
BATCH = 10
# "By default, FIFO queues support 300 transactions per second, per API action for SendMessage,
# ReceiveMessage, and DeleteMessage"; batch actions carry up to 10 messages per call:
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/troubleshooting-fifo-throttling-issues.html
FIFO_TPS_PER_ACTION = 300
# High-throughput FIFO (DeduplicationScope=messageGroup, FifoThroughputLimit=perMessageGroupId):
# 70,000 transactions/s per API action (700,000 messages/s in batches of 10) in US East (N.
# Virginia), US West (Oregon) and Europe (Ireland); other Regions lower (the smallest 2,400).
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html
HT_FIFO_TPS_PER_ACTION = 70_000
# Lambda: "For FIFO queues, concurrent invocations are capped either by the number of message
# group IDs or by the maximum concurrency setting, whichever is lower."
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html
# AWS publishes no figure for these two; they are assumptions, printed with every model line and
# meant to be replaced by measured ones (the writer's X-Ray trace: the Duration around the
# handler, and the database span):
DEFAULT_INVOKE_MS = 20.0  # poller ReceiveMessage + synchronous invoke + DeleteMessageBatch
DEFAULT_PROXY_RTT_MS = 1.0  # one statement per batch = one round trip through RDS Proxy


def fmt_seconds(seconds: float) -> str:
    return f"{seconds:7.1f} s" if seconds >= 1 else f"{1000 * seconds:5.0f} ms"


@dataclass(frozen=True)
class AwsModel:
    """The drain of one checkpoint barrier on AWS, from the measured batch cost and AWS quotas."""

    db_batch_ms: float  # measured on the local database (or --batch-ms)
    second_writer_gain: float  # measured: 1-writer drain / 2-writer drain
    invoke_ms: float
    proxy_rtt_ms: float
    concurrency: int
    ht_tps: int

    def writer_s(self, batches: int) -> float:
        """The writers: ``concurrency`` invocations in flight, each one batch at a time; the
        database does at most ``gain`` batches at once of one checkpoint (its row lock)."""
        per_invocation_ms = self.invoke_ms + self.proxy_rtt_ms + self.db_batch_ms
        invocations_per_s = self.concurrency * 1000 / per_invocation_ms
        gain = 1.0 if self.concurrency == 1 else self.second_writer_gain
        database_per_s = gain * 1000 / self.db_batch_ms
        return batches / min(invocations_per_s, database_per_s)

    def database_s(self, batches: int) -> float:
        """The database's share alone: its measured batch cost, with the measured second-writer
        gain when there is more than one writer."""
        gain = 1.0 if self.concurrency == 1 else self.second_writer_gain
        return batches * self.db_batch_ms / 1000 / gain

    def drain(self, ranks: int, tps: int) -> tuple[float, dict[str, float]]:
        """(drain seconds, seconds per limit) for ``ranks`` one-message sends at once."""
        batches = math.ceil(ranks / BATCH)
        parts = {
            # Each rank sends its own report: one SendMessageBatch call with one entry.
            "SQS send": ranks / tps,
            # The poller: one ReceiveMessage (10 records) and one DeleteMessageBatch per batch,
            # each its own action with its own quota.
            "SQS receive/delete": batches / tps,
            "writers": self.writer_s(batches),
        }
        return max(parts.values()), parts


def print_model(model: AwsModel, ranks: Sequence[int], source: str) -> None:
    """One line per (ranks, FIFO mode): the drain after a barrier and the limit hit first."""
    print(
        f"  AWS model: writer concurrency {model.concurrency}, per batch = database"
        f" {model.db_batch_ms:.2f} ms ({source}) + RDS Proxy round trip {model.proxy_rtt_ms:.1f}"
        f" ms (assumption) + event source overhead {model.invoke_ms:.0f} ms per invocation"
        f" (assumption); second writer {model.second_writer_gain:.2f}x (measured above)"
    )
    for n in ranks:
        for mode, tps in (("normal", FIFO_TPS_PER_ACTION), ("high-throughput", model.ht_tps)):
            total, parts = model.drain(n, tps)
            first = max(parts, key=lambda k: parts[k])
            detail = ", ".join(f"{k} {fmt_seconds(v).strip()}" for k, v in parts.items())
            print(
                f"    {n:7d} ranks, FIFO {mode:15} ({tps}/s per action): {detail}"
                f" -> drain ~{fmt_seconds(total).strip()}, limit hit first: {first}"
            )
        batches = math.ceil(n / BATCH)
        database_s = model.database_s(batches)
        bound = (
            "the database"
            if database_s >= model.writer_s(batches)
            else f"the time per invocation at concurrency {model.concurrency}"
        )
        print(
            f"    {n:7d} ranks: of the writers' time, the database alone (no invocation overhead,"
            f" no proxy) would take {fmt_seconds(database_s).strip()}: the writers are bound by"
            f" {bound}"
        )
