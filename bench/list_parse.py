"""The client's CPU to parse one ``ListObjectsV2`` page of 1,000 keys: botocore's parser as a
client is made by default, the same with ``timestamp_parser`` left as the text (botocore's
``ResponseParserFactory.set_parser_defaults``, what the AWS CLI does for its own listings), and
``xml.etree.ElementTree`` reading Key, Size and ETag of the same body (no client: the floor).

Why: verification by listing at 100,000 shards spends 0.08-0.12 ms of client CPU per object
(BENCHMARKS.md section 10), about 8-12 s for 100 pages on one core; this says where it goes.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from bench._harness import cli, load, median_ms, parse, table

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def page(keys: int) -> bytes:
    """One ListObjectsV2 answer of ``keys`` DCP files as S3 writes it (16 B objects, an ETag)."""
    contents = "".join(
        f"<Contents><Key>job/step-100000/__{r}_0.distcp</Key>"
        "<LastModified>2026-12-06T02:04:09.000Z</LastModified>"
        "<ETag>&quot;0123456789abcdef0123456789abcdef&quot;</ETag><Size>16</Size>"
        "<StorageClass>STANDARD</StorageClass></Contents>"
        for r in range(keys)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<ListBucketResult xmlns="{NS[1:-1]}"><Name>b</Name><Prefix>job/</Prefix>'
        f"<KeyCount>{keys}</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
        f"<NextContinuationToken>t</NextContinuationToken>{contents}</ListBucketResult>"
    ).encode()


def main(argv: Sequence[str] | None = None) -> int:
    p = cli(__doc__)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=30)
    args = parse(p, argv)
    import botocore.session
    from botocore import parsers

    shape = botocore.session.get_session().get_service_model("s3")
    output = shape.operation_model("ListObjectsV2").output_shape
    body = page(args.keys)
    response = {"body": body, "headers": {}, "status_code": 200}
    default = parsers.ResponseParserFactory().create_parser("rest-xml")
    factory = parsers.ResponseParserFactory()
    factory.set_parser_defaults(timestamp_parser=str)
    text_timestamps = factory.create_parser("rest-xml")

    def element_tree() -> dict[str, tuple[int, str | None]]:
        root = ET.fromstring(body)
        return {
            str(c.findtext(NS + "Key")): (
                int(c.findtext(NS + "Size") or 0),
                c.findtext(NS + "ETag"),
            )
            for c in root.iter(NS + "Contents")
        }

    print(f"list_parse: one page of {args.keys:,} keys ({len(body):,} B), medians of"
          f" {args.rounds}, load average {load()}")  # fmt: skip
    table("| parser | CPU per page | per key |")
    for name, call in (
        ("botocore, as a client parses by default", lambda: default.parse(response, output)),
        ("botocore, timestamp_parser=str", lambda: text_timestamps.parse(response, output)),
        ("ElementTree: Key, Size, ETag", element_tree),
    ):
        ms = median_ms(call, args.rounds, clock=time.process_time, warm=True)
        print(f"| {name} | {ms:.2f} ms | {1000 * ms / args.keys:.1f} µs |", flush=True)
    return 0
