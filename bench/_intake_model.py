"""The intake of one checkpoint barrier on AWS, four designs side by side: every rank's own
message on the FIFO queue (the default), reports packed per node on the FIFO queue, every rank's
own message on a standard queue, and packs on a standard queue.

Pure arithmetic: AWS's published quotas (each cited where it is defined below) and named
assumptions (:class:`Assumptions`, printed with every table). The drain of a barrier is the
slowest of three pipelined parts (sending, the event source's receiving and deleting, the
writers), plus, on a standard queue, one batching window at the tail: the last batch waits for
its window to close.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from bench._aws_model import FIFO_TPS_PER_ACTION, HT_FIFO_TPS_PER_ACTION

QueueKind = Literal["fifo", "standard"]

# Lambda's SQS event source, BatchSize: "For standard queues, the maximum is 10,000. For FIFO
# queues, the maximum is 10." "Batching window is not supported for FIFO queues."
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-parameters.html
FIFO_MAX_BATCH = 10
STANDARD_MAX_BATCH = 10_000
# "Lambda passes all of the records in the batch to the function in a single call, up to the
# payload limit for synchronous invocation (6 MB)"; "When you set BatchSize to a value greater
# than 10, you must set MaximumBatchingWindowInSeconds to at least 1."
# https://docs.aws.amazon.com/lambda/latest/api/API_CreateEventSourceMapping.html (BatchSize)
INVOKE_PAYLOAD_BYTES = 6 * 1024 * 1024
MIN_WINDOW_S = 1
# ReceiveMessage returns at most 10 messages per call (MaxNumberOfMessages 1-10), and
# DeleteMessageBatch deletes at most 10:
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html
RECEIVE_MAX = 10
# A message's body: 256 KiB in the older quota pages, 1 MiB today; the model holds packs to the
# older figure so that a pack fits every Region's queue:
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html
MESSAGE_MAX_BYTES = 256 * 1024
# In flight (received, not deleted): "a maximum of approximately 120,000" on standard queues,
# 120,000 on FIFO queues:
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-queues.html
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-fifo.html
IN_FLIGHT_MAX = 120_000
# FIFO: 300 transactions/s per API action without high throughput; 70,000 with it in the three
# largest Regions (bench._aws_model cites both). Standard queues: "nearly unlimited number of
# API calls per second, per API action":
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html
FIFO_TPS = FIFO_TPS_PER_ACTION
HT_FIFO_TPS = HT_FIFO_TPS_PER_ACTION
# Standard queues: "When messages are available, Lambda starts processing five batches at a time
# with five concurrent invocations"; maximum concurrency and provisioned pollers "are mutually
# exclusive options", and the writer needs maximum concurrency (2) to keep its connections at 2:
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html
STANDARD_START_POLLERS = 5


@dataclass(frozen=True)
class Assumptions:
    """What AWS does not publish, or what was measured here; printed with every table."""

    invoke_ms: float = 20.0  # poller receive + synchronous invoke + delete, per invocation
    proxy_rtt_ms: float = 1.0  # one statement per batch = one round trip through RDS Proxy
    batch10_ms: float = 1.11  # the writer's database cost of a 10-record batch (BENCHMARKS §6)
    row_ms: float = 0.06  # each further record of a large batch (measured: writer_throughput)
    body_bytes: int = 392  # one report's body (a typical sharded report, encoded here)
    envelope_bytes: int = 1000  # a record's event fields beyond its body (ids, handle, attrs)
    receive_ms: float = 20.0  # one ReceiveMessage or DeleteMessageBatch round trip of a poller
    pollers: int = STANDARD_START_POLLERS  # standard queue pollers at maximum concurrency 2
    ranks_per_pack: int = 8  # the ranks of one node (8 GPUs)
    window_s: float = MIN_WINDOW_S  # MaximumBatchingWindowInSeconds on a standard queue
    concurrency: int = 2  # the writers (reserved concurrency = MaximumConcurrency)

    def invocation_ms(self, rows: int) -> float:
        """One writer invocation of ``rows`` records: overhead, one statement, the rows."""
        return (
            self.invoke_ms + self.proxy_rtt_ms + self.batch10_ms + self.row_ms * max(0, rows - 10)
        )


@dataclass(frozen=True)
class Design:
    """One intake: which queue, how many reports per message, FIFO's throughput mode."""

    name: str
    queue: QueueKind
    packed: bool
    fifo_tps: int = HT_FIFO_TPS


DESIGNS = (
    Design("per-rank FIFO, normal", "fifo", False, FIFO_TPS),
    Design("per-rank FIFO, high-throughput (today)", "fifo", False),
    Design("packed per node, FIFO high-throughput", "fifo", True),
    Design("per-rank, standard queue", "standard", False),
    Design("packed per node, standard queue", "standard", True),
)


@dataclass(frozen=True)
class Drain:
    """The drain of one barrier in one design, and its parts."""

    design: Design
    ranks: int
    messages: int
    message_bytes: int
    per_invocation: int  # messages per invocation
    invocations: int
    parts: dict[str, float]  # seconds per part
    concurrency: int

    @property
    def seconds(self) -> float:
        window = 0.0 if self.design.queue == "fifo" else self.parts["batching window"]
        return max(v for k, v in self.parts.items() if k != "batching window") + window

    @property
    def limit(self) -> str:
        return max((k for k in self.parts if k != "batching window"), key=self.parts.__getitem__)

    @property
    def fits(self) -> bool:
        """The message within SQS's size, one invocation's records within what is in flight."""
        in_flight = self.per_invocation * self.concurrency
        return self.message_bytes <= MESSAGE_MAX_BYTES and in_flight <= IN_FLIGHT_MAX


def drain(design: Design, ranks: int, a: Assumptions) -> Drain:
    """The drain of a barrier of ``ranks`` reports sent at once."""
    pack = a.ranks_per_pack if design.packed else 1
    messages = math.ceil(ranks / pack)
    message_bytes = pack * a.body_bytes
    if design.queue == "fifo":
        per_invocation = min(FIFO_MAX_BATCH, messages)
    else:
        by_payload = INVOKE_PAYLOAD_BYTES // (message_bytes + a.envelope_bytes)
        per_invocation = max(1, min(STANDARD_MAX_BATCH, by_payload, messages))
    invocations = math.ceil(messages / per_invocation)
    rows = min(per_invocation * pack, ranks)
    writers = invocations * a.invocation_ms(rows) / 1000 / a.concurrency
    calls = math.ceil(messages / RECEIVE_MAX)
    parts: dict[str, float] = {}
    if design.queue == "fifo":
        # One SendMessageBatch call per message (a rank or a node leader sends as it goes); the
        # event source's ReceiveMessage and DeleteMessageBatch each have their own quota.
        parts["SQS send"] = messages / design.fifo_tps
        parts["SQS receive/delete"] = calls / design.fifo_tps
    else:
        parts["SQS send"] = 0.0  # "nearly unlimited" per action
        # The pollers fill each batch 10 messages per ReceiveMessage, and delete 10 per call.
        parts["SQS receive/delete"] = 2 * calls * a.receive_ms / 1000 / a.pollers
        parts["batching window"] = a.window_s
    parts["writers"] = writers
    return Drain(design, ranks, messages, message_bytes, per_invocation, invocations, parts,
                 a.concurrency)  # fmt: skip


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds >= 1 else f"{1000 * seconds:.0f} ms"


def print_assumptions(a: Assumptions) -> None:
    print(
        "  assumptions (not AWS figures; replace with an X-Ray trace of the writer and the"
        f" queue's metrics): {a.invoke_ms:g} ms event-source overhead per invocation, RDS Proxy"
        f" round trip {a.proxy_rtt_ms:g} ms per statement, {a.receive_ms:g} ms per poller"
        f" ReceiveMessage/DeleteMessageBatch, {a.pollers} standard-queue pollers at maximum"
        f" concurrency {a.concurrency}, {a.envelope_bytes} B of event fields per record beyond"
        f" its body; measured here: the writer's {a.batch10_ms:g} ms per 10-record batch and"
        f" {a.row_ms:g} ms per further record, a {a.body_bytes} B report body; a node ="
        f" {a.ranks_per_pack} ranks; standard-queue batching window {a.window_s:g} s"
    )


def print_table(ranks: list[int], a: Assumptions, goal_s: float = 15.0) -> list[Drain]:
    """One row per (ranks, design): messages, invocations, the parts, the drain."""
    print(
        f"  {'ranks':>7} {'design':40} {'msgs':>7} {'B/msg':>6} {'per inv':>7} {'invs':>6}"
        f" {'send':>8} {'recv/del':>8} {'writers':>8} {'drain':>8}  limit"
    )
    out = []
    for n in ranks:
        for design in DESIGNS:
            d = drain(design, n, a)
            out.append(d)
            p = d.parts
            mark = "" if d.fits else " (does not fit SQS's limits)"
            goal = " <= goal" if d.seconds <= goal_s and d.fits else ""
            print(
                f"  {n:7d} {design.name:40} {d.messages:7d} {d.message_bytes:6d}"
                f" {d.per_invocation:7d} {d.invocations:6d} {_s(p['SQS send']):>8}"
                f" {_s(p['SQS receive/delete']):>8} {_s(p['writers']):>8} {_s(d.seconds):>8}"
                f"  {d.limit}{' + window' if design.queue == 'standard' else ''}{goal}{mark}"
            )
    return out
