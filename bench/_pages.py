"""Where a listing's time goes (``python -m bench read_paths --pages``): a filled checkpoint's
key ranges listed one page at a time, with each range's prefix and with the checkpoint's, then
concurrently as ``verify_objects`` does at each ``--list-workers``; per page the wall time, this
process's CPU and the server's (``/proc``). Method and figures: BENCHMARKS.md §10.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench._cpu import tree_cpu_s as server_cpu
from bench._harness import caller_s3, load, table
from bench._s3_filled import Fill, etag
from ckpt_contract import StoredObject
from trainer_client.storage.verify import Expected, verify_objects
from trainer_client.storage.verify_rules import KeyRange, key_ranges


def expected_of(fill: Fill) -> list[Expected]:
    """Every object of ``fill`` as a report pins it (bytes, ETag)."""
    result = []
    for key in fill.object_keys():
        uri = f"s3://{fill.bucket}/{key}"
        pin = StoredObject(uri=uri, bytes=16, etag=etag(key))
        result.append(Expected(uri, 16, None, pin))
    return result


@dataclass
class Pages:
    """One way of listing a checkpoint: seconds of wall, client and server CPU per page (one
    sum for all when ``listed`` pages went concurrently)."""

    name: str
    listed: int = 0
    wall: list[float] = field(default_factory=list)
    client: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)
    keys: int = 0

    def row(self) -> str:
        def ms(xs: list[float]) -> str:
            return f"{1000 * statistics.median(xs):.1f}" if len(xs) == self.listed else ""

        return (
            f"| {self.name} | {self.listed} | {self.keys:,} | {sum(self.wall):.2f}"
            f" | {ms(self.wall)} | {sum(self.server):.2f} | {ms(self.server)}"
            f" | {sum(self.client):.2f} | {ms(self.client)} | {load()} |"
        )


def serial_pages(
    client: Any, fill: Fill, ranges: Sequence[KeyRange], prefix: Callable[[KeyRange], str],
    pid: int, name: str,
) -> Pages:  # fmt: skip
    """One ``ListObjectsV2`` per range, one at a time; each page's wall, client and server CPU."""
    pages = Pages(name, len(ranges))
    for r in ranges:
        request: dict[str, Any] = {"Bucket": fill.bucket, "Prefix": prefix(r), "MaxKeys": 1000}
        if r.start_after is not None:
            request["StartAfter"] = r.start_after
        s0, c0, t0 = server_cpu(pid), time.process_time(), time.perf_counter()
        answer = client.list_objects_v2(**request)
        pages.wall.append(time.perf_counter() - t0)
        pages.client.append(time.process_time() - c0)
        pages.server.append(server_cpu(pid) - s0)
        pages.keys += sum(r.holds(item["Key"]) for item in answer.get("Contents", []))
    return pages


def list_pages(endpoint: str, pid: int, fill: Fill, args: argparse.Namespace) -> None:
    """``fill``'s ranges listed page by page (unless ``--no-serial``), then by ``verify_objects``
    at each ``--list-workers``: one table row each."""
    ranges = key_ranges(fill.object_keys())
    client = caller_s3(endpoint, max(args.list_workers), text_timestamps=args.text_timestamps)
    client.list_objects_v2(Bucket=fill.bucket, MaxKeys=1)  # the connection, the first parse
    print(f"S3 ({args.s3_name}, pid {pid}): {fill.count:,} shards, {len(ranges)} ranges;"
          f" timestamps {'as text' if args.text_timestamps else 'parsed'}")  # fmt: skip
    table("| pages | n | keys | wall s | wall ms/page | server CPU s | server ms/page"
          " | client CPU s | client ms/page | load |")  # fmt: skip
    serial: list[tuple[str, Callable[[KeyRange], str]]] = [
        ("serial, each range's prefix", lambda r: r.prefix),
        ("serial, the checkpoint's prefix", lambda _r: fill.prefix),
    ]
    for name, prefix in [] if args.no_serial else serial:
        print(serial_pages(client, fill, ranges, prefix, pid, name).row(), flush=True)
    expected = expected_of(fill)
    for workers in args.list_workers:
        pages = Pages(f"verify_objects by listing, {workers} workers", len(ranges))
        s0, c0, t0 = server_cpu(pid), time.process_time(), time.perf_counter()
        result = verify_objects(
            expected, s3_client=client, max_workers=workers, list_workers=workers
        )
        pages.wall, pages.client = [time.perf_counter() - t0], [time.process_time() - c0]
        pages.server, pages.keys = [server_cpu(pid) - s0], result.checked
        if not result.intact:
            raise SystemExit(result.summary())
        print(pages.row(), flush=True)
