"""The AWS model of the intake designs: one barrier of N ranks drained by two writers.

Method and figures: BENCHMARKS.md §6. Pure arithmetic: AWS's published quotas (each cited where
it is defined below) and named assumptions (``Assumptions``, printed with every table). The
drain of a barrier is the slowest of three pipelined parts (sending, the event source's
receiving and deleting, the writers), plus one batching window at a standard queue's tail. Exit
1 if no design within SQS's limits drains the largest N within ``--goal-s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal

from bench._harness import cli, parse, secs
from ckpt_contract.pack import MAX_PACK_BYTES, pack_size
from trainer_client.report.pack_relay import (
    DEFAULT_LINGER_S,
    DEFAULT_MAX_REPORTS,
    DEFAULT_RETRY_AFTER_S,
    DEFAULT_TIMEOUT_S,
)

QueueKind = Literal["fifo", "standard"]

# Lambda's SQS event source, BatchSize: "For FIFO queues, the maximum is 10" (no batching window),
# "For standard queues, the maximum is 10,000":
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
# A message's body: 256 KiB in the older quota pages, 1 MiB since 2025 ("AWS has raised the
# maximum payload size from 256 KB to 1 MB for ... Amazon SQS",
# https://aws.amazon.com/blogs/compute/more-room-to-build-serverless-services-now-support-payloads-up-to-1-mb);
# a queue accepts what its MaximumMessageSize attribute allows (the stack leaves it unset). Packs
# keep to 256 KiB (ckpt_contract.pack), so that a pack fits every Region's queue:
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html
MESSAGE_MAX_BYTES = MAX_PACK_BYTES
# The ranks of one node (8 GPUs): what one leader per node packs.
NODE_RANKS = 8
# In flight (received, not deleted): "a maximum of approximately 120,000" on standard queues,
# 120,000 on FIFO queues:
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-queues.html
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-fifo.html
IN_FLIGHT_MAX = 120_000
# "By default, FIFO queues support 300 transactions per second, per API action for SendMessage,
# ReceiveMessage, and DeleteMessage" (batch actions carry up to 10 messages per call):
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/troubleshooting-fifo-throttling-issues.html
FIFO_TPS = 300
# High-throughput FIFO: 70,000 transactions/s per API action in US East (N. Virginia), US West
# (Oregon) and Europe (Ireland); other Regions lower (the smallest 2,400). Standard queues:
# "nearly unlimited number of API calls per second, per API action":
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html
HT_FIFO_TPS = 70_000
# Standard queues: "When messages are available, Lambda starts processing five batches at a time
# with five concurrent invocations"; maximum concurrency and provisioned pollers "are mutually
# exclusive options", and the writer needs maximum concurrency (2) to keep its connections at 2:
# https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html
STANDARD_START_POLLERS = 5


@dataclass(frozen=True)
class Assumptions:
    """What AWS does not publish, or what was measured here; printed with every table."""

    invoke_ms: float = 20.0  # poller receive + synchronous invoke + delete
    proxy_rtt_ms: float = 1.0  # one statement per batch: one RDS Proxy round trip
    batch10_ms: float = 1.11  # the writer's database cost of a 10-record batch (BENCHMARKS §6)
    row_ms: float = 0.06  # each further record of a large batch (measured: writer_throughput)
    body_bytes: int = 392  # one report's body (a typical sharded report, encoded here)
    envelope_bytes: int = 1000  # a record's event fields beyond its body (ids, handle, attrs)
    receive_ms: float = 20.0  # one ReceiveMessage or DeleteMessageBatch round trip of a poller
    pollers: int = STANDARD_START_POLLERS  # standard queue pollers at maximum concurrency 2
    # What the relay packs at most (trainer_client.report.pack_relay.DEFAULT_MAX_REPORTS): a leader
    # serving two nodes' 16 ranks; a leader per node packs its NODE_RANKS.
    ranks_per_pack: int = DEFAULT_MAX_REPORTS
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
    pack: int  # reports per message: 1 = every rank its own
    fifo_tps: int = HT_FIFO_TPS

    @property
    def packed(self) -> bool:
        return self.pack > 1


def designs(a: Assumptions) -> list[Design]:
    """Today's per-rank FIFO intake in both throughput modes, packs of one node's ranks and of
    the relay's cap on FIFO, and both on a standard queue (packs at the relay's cap)."""
    packs = sorted({NODE_RANKS, a.ranks_per_pack})
    return [
        Design("per-rank FIFO, normal", "fifo", 1, FIFO_TPS),
        Design("per-rank FIFO, high-throughput (today)", "fifo", 1),
        *(Design(f"packed per {k}, FIFO high-throughput", "fifo", k) for k in packs),
        Design("per-rank, standard queue (not built)", "standard", 1),
        Design(f"packed per {a.ranks_per_pack}, standard queue (not built)", "standard",
               a.ranks_per_pack),
    ]  # fmt: skip


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
    pack = design.pack
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


def print_assumptions(a: Assumptions) -> None:
    print(
        "  assumptions (not AWS figures; replace with an X-Ray trace of the writer and the"
        f" queue's metrics): {a.invoke_ms:g} ms event-source overhead per invocation, RDS Proxy"
        f" round trip {a.proxy_rtt_ms:g} ms per statement, {a.receive_ms:g} ms per poller"
        f" ReceiveMessage/DeleteMessageBatch, {a.pollers} standard-queue pollers at maximum"
        f" concurrency {a.concurrency}, {a.envelope_bytes} B of event fields per record beyond"
        f" its body; measured here: the writer's {a.batch10_ms:g} ms per 10-record batch and"
        f" {a.row_ms:g} ms per further record, a {a.body_bytes} B report body; a node ="
        f" {NODE_RANKS} ranks, a pack <= {a.ranks_per_pack} reports (the relay's cap) and"
        f" <= {MAX_PACK_BYTES // 1024} KiB; standard-queue batching window {a.window_s:g} s"
    )


def print_table(ranks: list[int], a: Assumptions, goal_s: float = 15.0) -> list[Drain]:
    """One row per (ranks, design): messages, invocations, the parts, the drain."""
    print(
        f"  {'ranks':>7} {'design':45} {'msgs':>7} {'B/msg':>6} {'per inv':>7} {'invs':>6}"
        f" {'send':>8} {'recv/del':>8} {'writers':>8} {'drain':>8}  limit"
    )
    out = []
    for n in ranks:
        for design in designs(a):
            d = drain(design, n, a)
            out.append(d)
            p = d.parts
            mark = "" if d.fits else " (does not fit SQS's limits)"
            goal = " <= goal" if d.seconds <= goal_s and d.fits else ""
            print(
                f"  {n:7d} {design.name:45} {d.messages:7d} {d.message_bytes:6d}"
                f" {d.per_invocation:7d} {d.invocations:6d} {secs(p['SQS send']):>8}"
                f" {secs(p['SQS receive/delete']):>8} {secs(p['writers']):>8} {secs(d.seconds):>8}"
                f"  {d.limit}{' + window' if design.queue == 'standard' else ''}{goal}{mark}"
            )
    return out


def sample_bodies() -> dict[str, int]:
    """Encoded bytes of one report of each kind a rank sends, built through the contract: the
    fan-in's bare shard, a Trainer checkpoint listed with its files' digests, a sharded save
    uploaded to S3 with every object pinned, and the largest body the contract lets through."""
    from datetime import UTC, datetime

    from ckpt_contract import CheckpointReport, encode
    from ckpt_contract.message import MAX_BODY_BYTES

    now, job, step, rank, world = datetime.now(UTC), "llama-405b-run17", 250_000, 99_999, 100_000
    common = {"job_id": job, "run_attempt": 3, "step": step, "epoch": 4, "rank": rank,
              "world_size": world, "loss": 1.8234, "created_at": now}  # fmt: skip
    digest = "9f" * 32
    files = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)] + [
        "optimizer.pt", "scheduler.pt", f"rng_state_{rank}.pth", "trainer_state.json",
        "config.json", "generation_config.json", "model.safetensors.index.json",
        "training_args.bin",
    ]  # fmt: skip
    listed = CheckpointReport.create(
        **common, uri=f"file:///mnt/efs/ckpt/{job}/checkpoint-{step}", bytes=16 * 2**30,
        metrics={"grad_norm": 0.41, "learning_rate": 1.5e-4}, files=files,
        file_sha256={f: digest for f in files},
    )  # fmt: skip
    pins = [
        {"uri": f"s3://ckpt-prod-us-east-1/{job}/step-{step}/__{rank}_{i}.distcp",
         "bytes": 2**31, "sha256": digest, "checksum_algorithm": "CRC64NVME",
         "checksum": "AAAAAAAAAAA=", "checksum_type": "FULL_OBJECT",
         "etag": '"' + "0f" * 16 + '-256"', "version_id": "3sL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY"}
        for i in range(8)
    ]  # fmt: skip
    pinned = CheckpointReport.create(
        **common, uri=f"s3://ckpt-prod-us-east-1/{job}/step-{step}/", bytes=8 * 2**31,
        objects=pins,
    )  # fmt: skip
    bare = CheckpointReport.create(**common, uri=f"file:///fanin/{step}/{rank}")
    return {
        "bare shard (the benches')": len(encode(bare).encode()),
        "Trainer checkpoint, 12 files listed with digests": len(encode(listed).encode()),
        "sharded save on S3, 8 objects pinned": len(encode(pinned).encode()),
        "the contract's largest body": MAX_BODY_BYTES,
    }


def print_pack_sizes(pack: int) -> None:
    """Per kind of report: one body, a pack of ``pack`` of them, and whether that fits a message
    (the relay splits a pack that would not: more, smaller packs, never a refused one)."""
    print(f"  pack size at {pack} reports (limit {MAX_PACK_BYTES} B, ckpt_contract.pack):")
    for name, size in sample_bodies().items():
        packed = pack_size(size * pack, pack)
        fits = packed <= MAX_PACK_BYTES
        most = max(k for k in range(1, pack + 1) if pack_size(size * k, k) <= MAX_PACK_BYTES)
        print(
            f"    {name:50} {size:6d} B each, {pack} in a pack {packed:8d} B:"
            f" {'fits' if fits else f'split by the relay into packs of {most}'}"
        )


GOAL_S = 15.0


def main(argv: Sequence[str] | None = None) -> int:
    """Print the assumptions and the table; 1 if the goal is out of every design's reach."""
    p = cli(__doc__)
    p.add_argument("--ranks", type=int, nargs="+", default=[1000, 16384, 100_000])
    # One option per assumption, named as its field (--invoke-ms, --row-ms, --pollers...).
    for f in fields(Assumptions):
        kind = float if f.type == "float" else int
        p.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default)
    p.add_argument("--goal-s", type=float, default=GOAL_S)
    args = parse(p, argv)
    if min(args.ranks) < 1 or args.ranks_per_pack < 1 or args.pollers < 1:
        p.error("--ranks, --ranks-per-pack and --pollers must be at least 1")
    if args.concurrency < 1 or args.window_s < 1:
        p.error("--concurrency must be at least 1, --window-s at least 1 (BatchSize > 10)")
    a = Assumptions(**{f.name: getattr(args, f.name) for f in fields(Assumptions)})
    print(
        f"intake model: one checkpoint barrier, {a.concurrency} writers, goal <= {args.goal_s:g} s"
    )
    print_assumptions(a)
    drains = print_table(sorted(args.ranks), a, args.goal_s)
    print_pack_sizes(a.ranks_per_pack)
    largest = max(args.ranks)
    met = [d for d in drains if d.ranks == largest and d.fits and d.seconds <= args.goal_s]
    print(
        f"  at {largest} ranks: {', '.join(d.design.name for d in met) or 'no design'} within"
        f" {args.goal_s:g} s"
    )
    print(
        "  packed per node: a rank that reports after its node's pack left goes in the next"
        f" pack (one more message, + the leader's {1000 * DEFAULT_LINGER_S:.0f} ms linger); a"
        " dead leader costs each of its ranks one refused connection (a hung one"
        f" {DEFAULT_TIMEOUT_S:g} s, the relay timeout), then the rank sends its own message as"
        f" today for {DEFAULT_RETRY_AFTER_S:g} s: at most ranks-per-pack messages more"
    )
    return 0 if met else 1
