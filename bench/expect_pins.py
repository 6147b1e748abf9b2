"""The client's CPU between the lookup and the listing: a checkpoint's shard rows decoded into
records, and the records into the objects to verify (``expectations()``, a pin validated each).

A DCP checkpoint of ``--shards`` ranks, each row pinning its ``__<rank>_0.distcp`` by size and
ETag (rank 0 the ``.metadata`` too), as the resume walk's one aggregated row returns them
(``trainer_client/restart/shard_rows.py``); no database, so the figures are the client's
alone: ``ShardRows.records`` (the decode), then ``expectations()``. Process CPU, medians of
``--rounds``, each round on fresh rows.

To compare another tree's client (main's, say), put that tree first on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench._harness import cli, load, parse
from bench._s3_filled import Fill, etag
from trainer_client.restart.shard_rows import ShardRows
from trainer_client.storage.verify import expectations


def aggregates(fill: Fill) -> tuple[Any, ...]:
    """The shard aggregates of ``fill``'s checkpoint as the server returns them."""
    keys = fill.object_keys()
    uris = [f"s3://{fill.bucket}/{k}" for k in keys[:-1]]
    pins = [
        json.dumps([{"uri": f"s3://{fill.bucket}/{k}", "bytes": 16, "etag": etag(k)} for k in mine])
        for mine in ([keys[r]] + ([keys[-1]] if r == 0 else []) for r in range(fill.count))
    ]
    n = fill.count
    ranks = ",".join(map(str, range(n)))
    return (n, 0, n - 1, ranks, "\n".join(uris), ",".join(["16"] * n), "," * (n - 1),
            ",".join(pins), None, None)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = cli(__doc__)
    p.add_argument("--shards", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=7)
    args = parse(p, argv)
    row = aggregates(Fill(f"rp-{args.shards}", f"job/step-{args.shards}/", args.shards))
    decode, expect = [], []
    for _ in range(args.rounds):
        rows = ShardRows(row)
        c0 = time.process_time()
        records = rows.records
        c1 = time.process_time()
        objects = expectations(records.values())
        c2 = time.process_time()
        decode.append(c1 - c0)
        expect.append(c2 - c1)
        if len(objects) != args.shards + 1:
            raise SystemExit(f"{len(objects)} objects, expected {args.shards + 1}")
        del rows, records, objects
    print(f"expect_pins: {args.shards:,} shards ({args.shards + 1:,} pins), medians of"
          f" {args.rounds}: decode {1000 * statistics.median(decode):.0f} ms, expectations()"
          f" {1000 * statistics.median(expect):.0f} ms (min {1000 * min(decode):.0f} /"
          f" {1000 * min(expect):.0f} ms); {sys.modules['trainer_client'].__file__};"
          f" load {load()}")  # fmt: skip
    return 0
