"""DCP at a restart, two ways on one checkpoint: ``dcp.load`` straight from S3 through
``s3torchconnector``'s ``S3StorageReader`` (its default DCP-optimised reader, on the AWS CRT),
against the restart's restore (``trainer_client.storage.restore``: verified, fsynced, renamed)
followed by ``dcp.load`` from the local copy.

The checkpoint: one process's state dict of ``tensors`` float32 tensors, ``size_gb`` in all, saved
through ``s3torchconnector``'s ``S3StorageWriter`` (one ``__0_0.distcp`` and ``.metadata``),
each object pinned with its SHA-256 (read back once, as a report with checksums carries it).
Both DCP classes take no endpoint, so their file system is swapped for one whose client has it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_client.storage.restore import RemoteObject, restore

_REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")


@dataclass(frozen=True)
class DcpRound:
    """One round's seconds: straight from S3, and restore + local load."""

    s3_load_s: float
    restore_s: float
    local_load_s: float


def _fs(endpoint: str, reader_constructor: Any = None) -> Any:
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp.s3_file_system import S3FileSystem

    config = S3ClientConfig(force_path_style=True)
    client = S3Client(_REGION, endpoint=endpoint, s3client_config=config)
    return S3FileSystem(_REGION, s3_client=client, reader_constructor=reader_constructor)


def _state(size_gb: float, tensors: int, fill: bool) -> dict[str, Any]:
    import torch

    each = int(size_gb * 1e9) // 4 // tensors
    generator = torch.Generator().manual_seed(0)
    return {
        f"t{i}": torch.rand(each, generator=generator) if fill else torch.empty(each)
        for i in range(tensors)
    }


def save_checkpoint(client: Any, endpoint: str, bucket: str, prefix: str, size_gb: float,
                    tensors: int) -> list[RemoteObject]:  # fmt: skip
    """Save the state dict to ``s3://bucket/prefix`` and pin its objects (size, SHA-256, ETag)."""
    from s3torchconnector.dcp import S3StorageWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    uri = f"s3://{bucket}/{prefix}"
    writer: Any = S3StorageWriter(_REGION, uri)
    writer.fs = _fs(endpoint)
    save(_state(size_gb, tensors, fill=True), storage_writer=writer)
    objects = []
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")["Contents"]
    for item in listed:
        digest = hashlib.sha256()
        for chunk in client.get_object(Bucket=bucket, Key=item["Key"])["Body"].iter_chunks(1 << 20):
            digest.update(chunk)
        objects.append(
            RemoteObject(
                f"s3://{bucket}/{item['Key']}",
                item["Key"][len(prefix) + 1 :],
                int(item["Size"]),
                digest.hexdigest(),
                etag=item["ETag"],
            )
        )
    return objects


def one_round(client: Any, endpoint: str, uri: str, objects: list[RemoteObject], size_gb: float,
              tensors: int, workers: int, scratch: Path) -> DcpRound:  # fmt: skip
    """Load the checkpoint from S3, then restore it and load it from disk (fresh state each)."""
    from s3torchconnector.dcp import S3StorageReader
    from torch.distributed.checkpoint.state_dict_loader import load

    reader: Any = S3StorageReader(_REGION, uri)
    reader.fs = _fs(endpoint, reader._reader_constructor)
    state = _state(size_gb, tensors, fill=False)
    start = time.perf_counter()
    load(state, storage_reader=reader)
    s3_load = time.perf_counter() - start
    del state

    dest = scratch / "dcp-restore" / "step-1"
    state = _state(size_gb, tensors, fill=False)
    start = time.perf_counter()
    restore(objects, dest, client=client, max_workers=workers)
    restored = time.perf_counter()
    load(state, checkpoint_id=str(dest))
    loaded = time.perf_counter()
    shutil.rmtree(dest.parent)
    return DcpRound(s3_load, restored - start, loaded - restored)
