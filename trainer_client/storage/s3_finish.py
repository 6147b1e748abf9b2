"""The finisher's upload step: a checkpoint saved locally is reported as its ``s3://`` copy.

Register ``S3Upload()`` with ``CheckpointReporter(post_steps=[...])`` and ask for it per save
with ``PostStepCall("s3_upload", {"prefix": "s3://bucket/prefix"})`` (the Hugging Face callback
and the Lightning IO take ``upload_to=`` and do both). After the finisher made the files durable
(and hashed them, with ``checksums``), the step uploads each file
(``trainer_client.storage.s3_upload``: managed multipart transfer with SHA-256, bounded concurrency)
and returns the report's new ``uri`` and the pins of every object (``objects``). The report leaves
only after the last object is stored and pinned, so an ``s3://`` report always names complete
objects.

Where things go: a file's key is its path relative to the *parent* of the checkpoint's base
directory, under the prefix (``params["root"]`` overrides that directory). So the Trainer's
``output_dir/checkpoint-500/model.safetensors`` becomes ``prefix/checkpoint-500/model.safetensors``
and the report's ``uri`` (the local ``checkpoint-500`` directory) ``prefix/checkpoint-500``;
Lightning's ``dirpath/epoch=0-step=10.ckpt`` becomes
``prefix/<dirpath's name>/epoch=0-step=10.ckpt``. With ``UploadSettings(spread_prefixes=N)``
(or ``params["spread_prefixes"]``, which the integrations record in each job so that whoever
finishes it uploads to the same keys) each object's key goes behind its spread segment
(``s3://bucket/<hex>/prefix/checkpoint-500/…``, ``storage/uri.py``): the pins carry those URIs,
the report's ``uri`` stays the unspread root, and a reader finds each object's name in the
checkpoint by taking the segment out (``restore.relative_name``).

``params["wait"]``: this rank does not upload but waits for the object another rank uploads
(Lightning's DDP: rank 0 writes the one file every rank reports) and reports it, pinned.

Killed part way: the finish job stays on disk, so the next start runs the step again. Files whose
upload completed are recorded in the job's state directory with their pin; a rerun HEADs each
one and skips it while the store still answers the same, and uploads the rest (aborting the
multipart upload the killed attempt left open). Nothing was reported before, so nothing is
reported twice with different contents.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckpt_contract.objects import StoredObject
from trainer_client.exceptions import DropCheckpoint, FinishDeferred
from trainer_client.finish.post_step import FinishingJob
from trainer_client.storage.durable import write_file_atomic
from trainer_client.storage.s3_pins import pin_from_head, split_s3_uri
from trainer_client.storage.s3_upload import UploadSettings, upload_file
from trainer_client.storage.uri import CheckpointUri
from trainer_client.storage.verify import Expected, compare_head

STEP_NAME = "s3_upload"


class S3Upload:
    """The ``s3_upload`` post-step (see the module docstring); idempotent, resumable."""

    name = STEP_NAME

    def __init__(self, *, client: Any = None, settings: UploadSettings | None = None) -> None:
        self._client = client
        self.settings = settings or UploadSettings()

    @property
    def client(self) -> Any:
        """The S3 client (built on first use from boto3's standard configuration)."""
        if self._client is None:
            import boto3
            from botocore.config import Config

            pool = max(10, self.settings.max_concurrency * 2)
            self._client = boto3.session.Session().client(
                "s3", config=Config(max_pool_connections=pool, retries={"mode": "standard"})
            )
        return self._client

    def run(self, job: FinishingJob, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Upload every file of ``job``; the report's ``uri`` and ``objects``."""
        prefix = params.get("prefix")
        if not isinstance(prefix, str):
            raise DropCheckpoint("s3_upload: params need a 'prefix' (s3://bucket/prefix)")
        try:
            split_s3_uri(prefix.rstrip("/") + "/x")
        except ValueError as exc:
            raise DropCheckpoint(f"s3_upload: prefix: {exc}") from None
        spread = params.get("spread_prefixes", self.settings.spread_prefixes)
        try:
            place = UploadSettings(spread_prefixes=spread)
        except (TypeError, ValueError) as exc:
            raise DropCheckpoint(f"s3_upload: {exc}") from None
        root = Path(str(params.get("root") or Path(job.job.base).parent))
        done = _Progress(job.state_dir)
        pins: list[StoredObject] = []
        for index, (path, saved) in enumerate(zip(job.paths, job.job.files, strict=True)):
            if job.should_stop():
                raise FinishDeferred("the reporter is closing")
            uri = place.key_for(_join(prefix, Path(saved.path), root))
            pin = done.get(index, uri)
            if params.get("wait"):
                pin = self._wait_for(uri, saved.identity.size, job)
            elif pin is None or not self._still_stored(pin):
                pin = upload_file(path, uri, client=self.client, settings=self.settings)
                if job.digests is not None and pin.sha256 != job.digests[index]:
                    raise DropCheckpoint(f"{path} changed while it was uploaded")
                done.put(index, pin)
            pins.append(pin)
        local = CheckpointUri.parse(str(job.job.fields.get("uri", "")))
        if local.scheme == "file":
            report_uri = _join(prefix, local.local_path, root)
        elif len(pins) == 1:
            report_uri = _join(prefix, Path(job.job.files[0].path), root)
        else:
            report_uri = prefix.rstrip("/")
        return {
            "uri": report_uri,
            "objects": pins,
            "extra": {"uploaded_from": str(job.job.fields.get("uri", ""))},
        }

    def _wait_for(self, uri: str, size: int, job: FinishingJob) -> StoredObject:
        """Another rank uploads this file (Lightning: rank 0 writes the one file every rank
        reports): wait until the store holds an object of its size, and pin that."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3_uri(uri)
        delay = 0.05
        while True:
            try:
                head = self.client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey"):
                    raise
            else:
                if int(head["ContentLength"]) == size:
                    return pin_from_head(uri, head)
            if job.should_stop():
                raise FinishDeferred(f"{uri} not uploaded yet and the reporter is closing")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _still_stored(self, pin: StoredObject) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = split_s3_uri(pin.uri)
        try:
            head = self.client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError:
            return False
        return compare_head(Expected(pin.uri, pin.bytes, pin.sha256, pin), head) is None


def _join(prefix: str, path: Path, root: Path) -> str:
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        raise DropCheckpoint(f"s3_upload: {path} is not under {root}")
    return posixpath.join(prefix.rstrip("/"), Path(relative).as_posix())


class _Progress:
    """The pins of the files already uploaded for this job (``state_dir/<index>.json``)."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def get(self, index: int, uri: str) -> StoredObject | None:
        path = self._directory / f"{index}.json"
        try:
            pin = StoredObject.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            return None
        return pin if pin.uri == uri else None

    def put(self, index: int, pin: StoredObject) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        write_file_atomic(self._directory / f"{index}.json", json.dumps(pin.model_dump()).encode())
