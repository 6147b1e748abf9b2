"""Pins of the objects one rank wrote in a DCP checkpoint on S3 (``s3torchconnector``'s writer).

DCP writes each rank's data to ``<checkpoint>/__<rank>_<n>.distcp`` and the coordinator (rank 0)
``<checkpoint>/.metadata`` last, the commit marker. ``s3torchconnector``'s ``S3StorageWriter``
completes each upload at its stream's ``close()`` and hands back no ETag or checksum (checked
here against moto: the objects carry none), so after the save's future resolved a rank lists its
own files under the checkpoint and pins each from a HEAD: what a resume compares with later.

Only the writer's default layout (every file directly under the checkpoint's prefix) is listed;
with another ``prefix_strategy`` the files live elsewhere, nothing is found, and the report
goes unpinned (with a warning).
"""

from __future__ import annotations

from typing import Any

from ckpt_contract.objects import StoredObject
from trainer_client.storage.s3_pins import head_pin, split_s3_uri

_METADATA = ".metadata"


def rank_objects(client: Any, checkpoint_uri: str, rank: int) -> list[StoredObject]:
    """The pins of ``rank``'s files of the DCP checkpoint at ``checkpoint_uri`` (sorted)."""
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
    return [head_pin(client, f"s3://{bucket}/{k}") for k in sorted(set(keys))]
