"""Checkpoints uploaded spread over S3 prefixes (``UploadSettings.spread_prefixes``): each
object at ``s3://bucket/<hex>/<key>``, on moto's S3. The report names the unspread root and pins
the spread objects; the restart restores them byte for byte; the listings that find a
checkpoint's objects (the verification, the restart's newer-checkpoint warning, reconcile) see
them; what is stored unspread reads as before."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.pipeline import LocalPipeline
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from trainer_client import CheckpointReporter
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.integrations._upload import with_upload
from trainer_client.restart.decide import connect_for_restart, decide_restart
from trainer_client.restart.wire_decision import from_bytes, to_bytes
from trainer_client.storage.restore import RemoteObject, relative_name, restore
from trainer_client.storage.s3_finish import S3Upload
from trainer_client.storage.s3_upload import UploadSettings, check_writable, upload_checkpoint
from trainer_client.storage.uri import spread_key, spread_width, unspread_uri
from trainer_client.storage.verify import Expected, verify_objects

SPREAD = UploadSettings(spread_prefixes=16)


def _checkpoint(root: Path, files: int = 20) -> dict[str, bytes]:
    """A Trainer-like ``checkpoint-N`` of one process (no file names a rank): ``files`` files
    beside the model and the commit marker, random bytes."""
    written = {f"optimizer/part-{r}.bin": os.urandom(1000 + r) for r in range(files)}
    written["model.safetensors"] = os.urandom(64 * 1024)
    written["trainer_state.json"] = b'{"global_step": 5}'
    for name, data in written.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return written


def test_a_spread_key_is_the_key_behind_the_start_of_its_sha256() -> None:
    key = "job/checkpoint-5/optimizer/part-3.bin"
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert spread_key(key, 0) == key
    assert spread_key(key, 16) == f"{digest[0]}/{key}"
    assert spread_key(key, 4_096) == f"{digest[:3]}/{key}"
    assert [spread_width(n) for n in (0, 16, 256, 4_096, 65_536)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"^spread_prefixes: must be 0 \(off\) or 16, .* not 100$"):
        UploadSettings(spread_prefixes=100)
    # The name in the checkpoint is found with the segment taken out; a key outside stays refused
    root = "s3://b/job/checkpoint-5"
    assert relative_name(root, f"s3://b/{digest[:2]}/{key}") == "optimizer/part-3.bin"
    assert relative_name(root, f"{root}/optimizer/part-3.bin") == "optimizer/part-3.bin"
    assert unspread_uri(f"s3://b/{digest[:2]}/{key}", 2) == f"s3://b/{key}"
    with pytest.raises(Exception, match="is not inside the checkpoint"):
        relative_name(root, f"s3://b/{digest[:2]}/other/checkpoint-5/x")


def test_upload_to_records_the_spread_in_each_finish_job() -> None:
    spread = S3Upload(client=object(), settings=UploadSettings(spread_prefixes=4_096))
    (call,), _ = with_upload("s3://b/run", [], [], upload=spread)
    assert call.params == {"prefix": "s3://b/run", "spread_prefixes": 4_096}
    (call,), _ = with_upload("s3://b/run", [], [])
    assert call.params == {"prefix": "s3://b/run"}  # off: the job as before


def test_a_spread_upload_is_verified_by_listing_and_restored_byte_for_byte(
    s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # GIVEN a 22-file checkpoint uploaded spread over 16 prefixes
    files = _checkpoint(tmp_path / "checkpoint-5")
    root = f"s3://{s3_bucket}/job/checkpoint-5"
    pins = upload_checkpoint(tmp_path / "checkpoint-5", root, client=s3, settings=SPREAD)
    # THEN every object is at its spread key, and they use several prefixes
    segments = Counter(p.uri.split("/")[3] for p in pins)
    assert len(segments) > 1 and all(len(s) == 1 for s in segments)
    assert sorted(relative_name(root, p.uri) for p in pins) == sorted(files)
    # AND the verification by listing finds each one intact, listing the spread prefixes only
    calls: Counter[str] = Counter()
    prefixes: set[str] = set()

    def count(params: dict[str, Any], model: Any, **_: Any) -> None:
        calls[model.name] += 1
        if model.name == "ListObjectsV2":
            prefixes.add(params["Prefix"])

    s3.meta.events.register("provide-client-params.s3.*", count)
    expected = [Expected(p.uri, p.bytes, p.sha256, p) for p in pins]
    checked = verify_objects(expected, s3_client=s3)
    assert checked.intact and checked.checked == len(files)
    assert calls["HeadObject"] == 0 and calls["ListObjectsV2"] == len(segments)
    assert all(p.split("/")[0] in segments for p in prefixes)  # never across the bucket
    # WHEN one spread object is deleted THEN the verification says which
    gone = pins[3]
    s3.delete_object(Bucket=s3_bucket, Key=gone.uri.split("/", 3)[3])
    damaged = verify_objects(expected, s3_client=s3)
    assert not damaged.intact and gone.uri in damaged.summary()
    upload_checkpoint(tmp_path / "checkpoint-5", root, client=s3, settings=SPREAD)
    # AND a restore into a fresh directory gives the files byte for byte, by their names
    pins = upload_checkpoint(tmp_path / "checkpoint-5", root, client=s3, settings=SPREAD)
    objects = [
        RemoteObject(p.uri, relative_name(root, p.uri), p.bytes, p.sha256, p.version_id, p.etag)
        for p in pins
    ]
    done = restore(objects, tmp_path / "fresh" / "checkpoint-5", client=s3, max_workers=4)
    assert done.source == "store"
    assert {n: (done.path / n).read_bytes() for n in files} == files
    # AND the start-up write check writes where the objects go (and leaves nothing)
    check_writable(s3, f"s3://{s3_bucket}/job", spread_prefixes=16)
    assert s3.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _report(pipeline: LocalPipeline, s3: Any, prefix: str, job: str, directory: Path) -> None:
    with CheckpointReporter(
        pipeline.queues.queue_url,
        job_id=job,
        spool_dir=directory.parent / "spool",
        rank=0,
        world_size=1,
        endpoint_url=pipeline.endpoint_url,
        install_signal_handler=False,
        spot_poll=False,
        post_steps=[S3Upload(client=s3)],  # a default step, as ``ckpt-pipeline spool send``'s
    ) as reporter:
        outcome = reporter.finish(
            sorted(p for p in directory.rglob("*") if p.is_file()),
            base=directory,
            checksums=True,
            # what upload_to= with a spread S3Upload records in the job, beside the prefix
            post=[PostStepCall("s3_upload", {"prefix": prefix, "spread_prefixes": 256})],
            step=5,
            epoch=0,
            uri=directory.as_uri(),
        ).result(timeout=60)
        assert outcome.status == "reported"
        assert reporter.flush(30)
    settle(pipeline)


@pytest.mark.slow
def test_a_spread_checkpoint_is_reported_restored_and_reconciled(
    pipeline: LocalPipeline,
    s3: Any,
    s3_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = f"spread-{uuid.uuid4().hex[:8]}"
    prefix = f"s3://{s3_bucket}/{job}"
    files = _checkpoint(tmp_path / "out" / "checkpoint-5")
    # GIVEN checkpoint-5 reported through the finisher's upload, spread over 256 prefixes
    _report(pipeline, s3, prefix, job, tmp_path / "out" / "checkpoint-5")
    # WHEN the restart decides THEN it resumes from the unspread root, each object at its
    # spread key under its name in the checkpoint (and so through the decision's wire form)
    with connect_for_restart(pipeline.database_url) as conn:
        decision = decide_restart(
            conn, job, [], time.monotonic() + 30, check_files=True, s3_client=s3,
            max_workers=4,
        )  # fmt: skip
    assert decision.point is not None and decision.point.path == f"{prefix}/checkpoint-5"
    assert sorted(o.relative for o in decision.objects) == sorted(files)
    assert all(o.uri.split("/")[3] != job for o in decision.objects)
    assert decision.store_newer is None
    assert from_bytes(to_bytes(decision)).objects == decision.objects
    # (on the wire each spread object is its row and the spread's width, never its URI)
    assert s3_bucket.encode() not in zlib.decompress(to_bytes(decision)).split(b'"o"')[1]
    # AND the restore on a fresh node is the checkpoint byte for byte
    done = restore(decision.objects, tmp_path / "node" / "checkpoint-5", client=s3, max_workers=4)
    assert {n: (done.path / n).read_bytes() for n in files} == files
    # WHEN a newer checkpoint is in the store, spread the same way, with no report
    newer = _checkpoint(tmp_path / "out" / "checkpoint-9", files=2)
    upload_checkpoint(
        tmp_path / "out" / "checkpoint-9",
        f"{prefix}/checkpoint-9",
        client=s3,
        settings=UploadSettings(spread_prefixes=256),
    )
    # THEN the restart's listing sees it
    with connect_for_restart(pipeline.database_url) as conn:
        decision = decide_restart(
            conn, job, [], time.monotonic() + 30, check_files=True, s3_client=s3,
            max_workers=4,
        )  # fmt: skip
    assert decision.store_newer == (9, f"{prefix}/checkpoint-9/")
    # AND reconcile (its spread taken from the rows) finds it unreported and step 5 as reported
    argv = ["reconcile", "--job", job, "--store", prefix, "--min-age", "0"]
    env = {**os.environ, "DATABASE_URL": pipeline.database_url}
    assert main(argv, env) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"unreported  step 9        {prefix}/checkpoint-9/ [hf]")
    assert f"{len(newer)} objects" in out[0]
    assert (
        "2 checkpoints in the store, 1 with rows; 1 unreported, 0 partial, 0 differing" in (out[-1])
    )
    # WHEN one of step 5's spread objects is deleted THEN reconcile says it differs
    gone = next(o for o in sorted(decision.objects, key=lambda o: o.relative))
    s3.delete_object(Bucket=s3_bucket, Key=gone.uri.split("/", 3)[3])
    assert main([*argv, "--spread-prefixes", "256"], env) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("differs     step 5") and gone.uri in line for line in out)
    # AND a count that is no spread's is refused, naming the option
    assert main([*argv, "--spread-prefixes", "100"], env) == 2
    assert "--spread-prefixes: must be 0" in capsys.readouterr().err
