"""Pins of the objects one rank wrote in a DCP checkpoint on S3 (``s3torchconnector``'s writer).

DCP writes each rank's data to ``<checkpoint>/__<rank>_<n>.distcp`` and the coordinator (rank 0)
``<checkpoint>/.metadata`` last, the commit marker. ``s3torchconnector``'s ``S3StorageWriter``
completes each upload at its stream's ``close()`` and hands back no ETag or checksum (checked
here against moto: the objects carry none), so after the save's future resolved a rank lists its
own files under the checkpoint and pins each from a HEAD: what a resume compares with later.

A HEAD vouches for the object as it stands after the save, not for the bytes DCP produced.
:func:`hash_uploads` closes that gap: installed on the writer before the save, it hashes every
file as DCP writes it (SHA-256 of the stream, nothing read back), and the pins then carry those
digests, which the restore checks while streaming.

Only the writer's default layout (every file directly under the checkpoint's prefix) is listed;
with another ``prefix_strategy`` the files live elsewhere, nothing is found, and the report
goes unpinned (with a warning).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
from collections.abc import Iterator
from typing import Any

from ckpt_contract.objects import StoredObject
from trainer_client.storage.s3_pins import head_pin, split_s3_uri

_METADATA = ".metadata"


class HashedUploads:
    """A DCP ``S3StorageWriter``'s file system that hashes every file it uploads (see
    :func:`hash_uploads`): ``sha256(uri)`` is the digest of the bytes written to ``uri``, once its
    upload completed (``None`` for a file it did not write)."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        # by (bucket, key): DCP's paths are ``os.path.join``-ed URIs, a report's are normalised
        self._digests: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        with self._fs.create_stream(path, mode) as stream:
            if mode != "wb":
                yield stream
                return
            hashing = _HashingStream(stream)
            yield hashing
            hashing.close()  # completes the upload (raises if it failed): only then recorded
        with self._lock:
            self._digests[split_s3_uri(os.fspath(path))] = hashing.digest.hexdigest()

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        # DCP writes ``.metadata`` under a temporary name and renames it (a copy on S3).
        self._fs.rename(path, new_path)
        with self._lock:
            digest = self._digests.pop(split_s3_uri(os.fspath(path)), None)
            if digest is not None:
                self._digests[split_s3_uri(os.fspath(new_path))] = digest

    def sha256(self, uri: str) -> str | None:
        with self._lock:
            return self._digests.get(split_s3_uri(uri))


class _HashingStream(io.IOBase):
    """The upload stream, each written byte also fed to a SHA-256 in order (DCP writes a file
    front to back: ``S3Writer`` cannot seek)."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._stream = stream
        self.digest = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        written = self._stream.write(data)
        view = memoryview(data).cast("B")
        self.digest.update(view if written is None else view[:written])
        return len(view) if written is None else int(written)

    def tell(self) -> int:
        return int(self._stream.tell())

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            super().close()


def hash_uploads(writer: Any) -> HashedUploads:
    """Hash every file ``writer`` (an ``S3StorageWriter``) uploads, as it is written; hand the
    result to ``report_when_saved(…, sha256_of=…)`` so the report pins each file's SHA-256."""
    hashed = HashedUploads(writer.fs)
    writer.fs = hashed
    return hashed


def rank_objects(
    client: Any, checkpoint_uri: str, rank: int, *, sha256_of: HashedUploads | None = None
) -> list[StoredObject]:
    """The pins of ``rank``'s files of the DCP checkpoint at ``checkpoint_uri`` (sorted), each
    with its SHA-256 where ``sha256_of`` hashed its upload."""
    bucket, key = split_s3_uri(checkpoint_uri.rstrip("/") + "/")
    names = [f"{key}__{rank}_"]
    if rank == 0:
        names.append(key + _METADATA)
    keys: list[str] = []
    for prefix in names:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(
                item["Key"]
                for item in page.get("Contents", [])
                if item["Key"].endswith(".distcp") or item["Key"].endswith(_METADATA)
            )
    uris = [f"s3://{bucket}/{k}" for k in sorted(set(keys))]
    return [
        head_pin(client, uri, sha256=None if sha256_of is None else sha256_of.sha256(uri))
        for uri in uris
    ]
