"""Verification of one large checkpoint on S3: HeadObject per object, concurrently and bounded.

Method and figures: BENCHMARKS.md §7 (moto's S3 in its own process: its HEAD rate bounds the
figures; the client's side is what they show).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench._harness import cli, helpers_s3, load, machine, moto_sqs, parse
from trainer_client.storage.s3_pins import head_pin
from trainer_client.storage.verify import Expected, verify_objects


def upload(client: Any, bucket: str, shards: int, size: int) -> list[Expected]:
    """Every rank's object, uploaded with a SHA-256 checksum and pinned from its HEAD."""

    def one(rank: int) -> Expected:
        data = os.urandom(size)
        key = f"job/step-100/__{rank}_0.distcp"
        client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")
        digest = hashlib.sha256(data).hexdigest()
        pin = head_pin(client, f"s3://{bucket}/{key}", sha256=digest)
        return Expected(pin.uri, pin.bytes, digest, pin)

    with ThreadPoolExecutor(32) as pool:
        return list(pool.map(one, range(shards)))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the verification times of one checkpoint; 1 if any run found a difference."""
    p = cli(__doc__)
    p.add_argument("--shards", type=int, default=4096)
    p.add_argument("--size", type=int, default=4096, help="bytes per object (default 4096)")
    p.add_argument("--workers", type=int, nargs="+", default=[8, 32, 64, 128])
    p.add_argument("--rounds", type=int, default=3)
    args = parse(p, argv)
    if min(args.shards, args.size, args.rounds, *args.workers) < 1:
        p.error("--shards, --size, --rounds and --workers must be at least 1")
    status = 0
    with moto_sqs() as (endpoint, _):
        client = helpers_s3(endpoint, max(args.workers))
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        started = time.perf_counter()
        expected = upload(client, bucket, args.shards, args.size)
        print(
            f"verify_s3: {args.shards} objects of {args.size} B on moto's S3 server (own process),"
            f" uploaded and pinned in {time.perf_counter() - started:.1f} s;"
            f" {machine()}"
        )
        print(
            f"{'check':<34} {'workers':>7} {'seconds':>8} {'objects/s':>10}"
            f" {'client CPU ms/object':>21}"
        )
        for workers in args.workers:
            best, cpu = float("inf"), 0.0
            for _ in range(args.rounds):
                t0, c0 = time.perf_counter(), time.process_time()
                result = verify_objects(
                    expected, s3_client=client, max_workers=workers, verify_by="head"
                )
                took = time.perf_counter() - t0
                if took < best:
                    best, cpu = took, time.process_time() - c0
                if not result.intact or result.checked != len(expected):
                    print(f"  unexpected: {result.summary()}", file=sys.stderr)
                    status = 1
            per_object_ms = 1000 * cpu / len(expected)
            print(f"{'HEAD (ChecksumMode=ENABLED)':<34} {workers:>7} {best:>8.2f}"
                  f" {len(expected) / best:>10.0f} {per_object_ms:>21.2f}")  # fmt: skip
        workers = max(args.workers)
        t0 = time.perf_counter()
        deep = verify_objects(expected, s3_client=client, max_workers=workers, deep=True)
        took = time.perf_counter() - t0
        print(f"{'HEAD + GET + sha256 (deep)':<34} {workers:>7} {took:>8.2f}"
              f" {len(expected) / took:>10.0f}")  # fmt: skip
        if not deep.intact:
            status = 1
        last = expected[-1]
        key = last.uri.split("/", 3)[3]
        client.put_object(Bucket=bucket, Key=key, Body=os.urandom(max(0, args.size - 1)))
        t0 = time.perf_counter()
        damaged = verify_objects(expected, s3_client=client, max_workers=workers, verify_by="head")
        took = time.perf_counter() - t0
        print(f"{'HEAD, last object truncated':<34} {workers:>7} {took:>8.2f}"
              f" {damaged.checked:>10} checked: {damaged.summary()}")  # fmt: skip
        if damaged.intact:
            status = 1
    print(f"load average after: {load()}")
    return status
