"""``reconcile --backfill``: the reports that describe an unreported checkpoint as the store holds
it now, sent through the pipeline's queue with the contract's ids (see :mod:`.reconcile`)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from ckpt_contract import CheckpointReport, StoredObject, encode
from ckpt_contract.dlq import ORIGINAL_SENDER_ID
from ckpt_pipeline.exceptions import ReconcileError
from ckpt_pipeline.ops.reconcile import Store
from ckpt_pipeline.ops.reconcile_findings import Backfill
from ckpt_pipeline.ops.reconcile_layout import StoreObject
from trainer_client.storage.s3_pins import pin_from_head
from trainer_client.storage.uri import CheckpointUri

_SQS_BATCH = 10


def backfill_reports(
    job_id: str, backfill: Backfill, *, store: Store, s3: Any, run_attempt: int
) -> list[CheckpointReport]:
    """The reports that describe ``backfill``'s ranks of its checkpoint as they are in the store
    now (pins included): each rank with its own objects where the layout names ranks, else each
    with the whole checkpoint. ``run_attempt``: for a checkpoint with no rows (a partial one's
    reports take its rows' attempt)."""
    checkpoint = backfill.checkpoint
    attempt = run_attempt if backfill.run_attempt is None else backfill.run_attempt
    at = datetime.now(UTC)
    reports = []
    for rank in backfill.ranks:
        objects = checkpoint.ranks[rank] if checkpoint.ranks else checkpoint.objects
        pins = [_pin(o, s3) for o in sorted(objects, key=lambda o: o.relative)]
        uri = store.uri + checkpoint.location
        if checkpoint.ranks and len(objects) == 1 and checkpoint.layout == "per-rank":
            uri = objects[0].uri
            if not uri.startswith(store.uri):  # uploaded spread: reports name the unspread key
                uri = store.uri + objects[0].relative
        reports.append(
            CheckpointReport.create(
                job_id=job_id,
                run_attempt=attempt,
                launch_id=backfill.launch_id,
                step=checkpoint.step,
                epoch=checkpoint.epoch,
                world_size=backfill.world_size,
                rank=rank,
                uri=uri,
                bytes=sum(p.bytes for p in pins),
                objects=pins,
                backfilled=True,
                layout=checkpoint.layout,
                created_at=at,
            )
        )
    return reports


def _pin(obj: StoreObject, s3: Any) -> StoredObject:
    if obj.uri.startswith("s3://"):
        bucket, key = obj.uri[len("s3://") :].split("/", 1)
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        return pin_from_head(obj.uri, head)
    return StoredObject(uri=obj.uri, bytes=CheckpointUri.parse(obj.uri).local_path.stat().st_size)


def send_reports(
    sqs: Any, queue_url: str, reports: list[CheckpointReport], *, owner: str | None = None
) -> int:
    """Send through the pipeline's queue with the contract's ids; returns how many were sent.

    ``owner``: the job's owner (``ckpt_job_owners``), carried as the reports' original sender: the
    writer writes them as the owner's when the replay principal sends them (docs/deploy.md, "Who
    may write which job"), as a replay is; a job without one is claimed by whoever sends.
    """
    attributes = (
        {}
        if owner is None
        else {
            "MessageAttributes": {
                ORIGINAL_SENDER_ID: {"DataType": "String", "StringValue": owner},
            }
        }
    )
    sent = 0
    for start in range(0, len(reports), _SQS_BATCH):
        batch = reports[start : start + _SQS_BATCH]
        entries = {
            str(i): {
                "Id": str(i),
                "MessageBody": encode(r),
                "MessageGroupId": r.group_id,
                "MessageDeduplicationId": r.dedup_id,
                **attributes,
            }
            for i, r in enumerate(batch)
        }
        for _attempt in range(5):
            answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=list(entries.values()))
            for ok in answer.get("Successful", []):
                entries.pop(ok["Id"], None)
                sent += 1
            if not entries:
                break
            time.sleep(0.2)
        if entries:
            failed = answer.get("Failed", [{}])[0]
            raise ReconcileError(f"SQS refused a report: {failed.get('Message')}")
    return sent
