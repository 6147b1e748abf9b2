"""Checkpoint URIs: the one parser of where a checkpoint's bytes live.

A report's ``uri`` (and each pinned object's) is ``s3://bucket/key``, ``file:///abs/path`` or, from
a caller's own reporter, a bare path. Every reader splits it here: the S3 upload and pins, the
verification, the resume helpers and the operator tools (reconcile, prune).
"""

from __future__ import annotations

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
