"""Checkpoint URIs: the one parser of where a checkpoint's bytes live.

A report's ``uri`` (and each pinned object's) is ``s3://bucket/key``, ``file:///abs/path`` or, from
a caller's own reporter, a bare path. Every reader splits it here: the S3 upload and pins, the
verification, the resume helpers and the operator tools (reconcile, prune).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse, urlunparse


@dataclass(frozen=True)
class CheckpointUri:
    """A URI split as written (``path`` still percent-encoded); ``scheme`` is ``""`` for a path."""

    scheme: str
    netloc: str
    path: str
    # params, query and fragment: kept by :meth:`with_path`, never read.
    rest: tuple[str, str, str] = ("", "", "")

    @classmethod
    def parse(cls, text: str) -> CheckpointUri:
        parsed = urlparse(text)
        return cls(
            parsed.scheme,
            parsed.netloc,
            parsed.path,
            (parsed.params, parsed.query, parsed.fragment),
        )

    @property
    def bucket(self) -> str:
        """The bucket of an ``s3://`` URI."""
        return self.netloc

    @property
    def key(self) -> str:
        """The object key of an ``s3://`` URI (the path without its leading slash)."""
        return self.path.lstrip("/")

    @property
    def decoded_path(self) -> str:
        """The path with its percent-escapes decoded (a ``file://`` URI's file name)."""
        return unquote(self.path)

    @property
    def local_path(self) -> Path:
        """The file a ``file://`` URI names."""
        return Path(self.decoded_path)

    @property
    def is_local_host(self) -> bool:
        """Whether a ``file://`` URI names this host (no host, or ``localhost``)."""
        return self.netloc in ("", "localhost")

    def with_path(self, path: str) -> str:
        """This URI with ``path`` in place of its own (query and fragment kept)."""
        return urlunparse((self.scheme, self.netloc, path, *self.rest))

    def location(self, path: str) -> str:
        """The URI of ``path`` on this URI's store (scheme and host only)."""
        return urlunparse((self.scheme, self.netloc, path, "", "", ""))


# -- spreading a checkpoint's keys over S3 prefixes ------------------------------------------------
#
# S3 serves "at least 3,500 PUT/COPY/POST/DELETE or 5,500 GET/HEAD requests per second per
# partitioned Amazon S3 prefix", with "no limits to the number of prefixes in a bucket"
# (https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html), and
# "if you create 10 prefixes in an Amazon S3 bucket to parallelize reads, you could scale your
# read performance to 55,000 read requests per second" (same page). Partitioning by prefix is
# automatic and follows sustained load (https://aws.amazon.com/premiumsupport/knowledge-center/s3-object-key-naming-pattern/):
# a restart's burst on new keys meets few partitions unless the keys already differ at the front.
# A spread key is ``<hex>/<key>``: the hex is the start of the SHA-256 of the unspread key, so
# anyone who holds the key computes where it went, and a reader tells the number of prefixes
# from one spread key (its width): 16 ** width. Hence the counts are powers of 16.
SPREAD_PREFIXES = (16, 256, 4_096, 65_536)


def check_spread(prefixes: int, field: str) -> None:
    """Raise ``ValueError("<field>: ...")`` unless ``prefixes`` is 0 (off) or a spread count."""
    if prefixes != 0 and prefixes not in SPREAD_PREFIXES:
        raise ValueError(
            f"{field}: must be 0 (off) or 16, 256, 4,096 or 65,536 (a power of 16: one to four"
            f" hex digits in front of the key), not {prefixes}"
        )


def spread_width(prefixes: int) -> int:
    """The hex digits of a spread key's first segment (0: not spread)."""
    check_spread(prefixes, "spread_prefixes")
    return 0 if prefixes == 0 else SPREAD_PREFIXES.index(prefixes) + 1


def spread_key(key: str, prefixes: int) -> str:
    """``key`` under its spread prefix (``<hex>/<key>``); ``key`` itself for ``prefixes`` 0."""
    width = spread_width(prefixes)
    if width == 0:
        return key
    return f"{hashlib.sha256(key.encode()).hexdigest()[:width]}/{key}"


def spread_segments(width: int) -> list[str]:
    """Every first segment of spread keys of ``width`` hex digits, in S3's listing order (none
    for 0: an unspread store has no spread prefixes; 16**0 would name one, "0")."""
    return [f"{n:0{width}x}" for n in range(16**width)] if width else []


def spread_of(key: str, unspread: str) -> int:
    """The width of the spread segment in front of ``unspread`` in ``key`` (``<hex>/<unspread>``
    with ``<hex>`` 1-4 lowercase hex digits), or 0 when ``key`` is not that."""
    segment, slash, rest = key.partition("/")
    if (
        slash
        and 1 <= len(segment) <= len(SPREAD_PREFIXES)
        and all(c in "0123456789abcdef" for c in segment)
        and (rest == unspread or rest.startswith(unspread.rstrip("/") + "/") or not unspread)
    ):
        return len(segment)
    return 0


def unspread_uri(uri: str, width: int) -> str | None:
    """``s3://bucket/<hex>/<key>`` with its ``width``-digit spread segment taken out (None when
    the key has no such segment); ``width`` 0 gives ``uri`` itself."""
    if width == 0:
        return uri
    parsed = CheckpointUri.parse(uri)
    if spread_of(parsed.key, "") != width:
        return None
    return parsed.with_path("/" + parsed.key.partition("/")[2])


def without_spread(uri: str, root: str) -> str:
    """``uri`` without the spread segment in front of ``root``'s key (``s3://bucket/<hex>/<root
    key>/…``), or ``uri`` itself when it has none there (or is not on S3)."""
    parsed = CheckpointUri.parse(uri)
    if parsed.scheme != "s3":
        return uri
    width = spread_of(parsed.key, CheckpointUri.parse(root).key)
    return (unspread_uri(uri, width) or uri) if width else uri
