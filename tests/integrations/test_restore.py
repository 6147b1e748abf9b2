"""Restoring a checkpoint from S3 (moto's server) to local disk: verified while streaming, atomic,
local copy first, and a restore killed midway leaves nothing a framework would load."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.trainer_client.helpers import REPO_ROOT, child_env
from trainer_client.restart.decide import newer_in_listing
from trainer_client.restart.lookup import ResumePoint
from trainer_client.storage.exceptions import RestoreError
from trainer_client.storage.restore import (
    MANIFEST,
    RemoteObject,
    relative_name,
    restore,
)
from trainer_client.storage.restore_fetch import FetchTrace


def _put(s3: Any, bucket: str, key: str, data: bytes) -> RemoteObject:
    head = s3.put_object(Bucket=bucket, Key=key, Body=data)
    return RemoteObject(
        uri=f"s3://{bucket}/{key}",
        relative=key.split("checkpoint-4/", 1)[1] if "checkpoint-4/" in key else "",
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        etag=head["ETag"],
    )


def _checkpoint(s3: Any, bucket: str, sizes: dict[str, int]) -> list[RemoteObject]:
    return [
        _put(s3, bucket, f"job/checkpoint-4/{name}", os.urandom(size))
        for name, size in sizes.items()
    ]


SIZES = {"model.safetensors": 3 * 1024 * 1024 + 17, "optimizer.pt": 100_000, "sub/x.json": 0}


def test_restores_every_object_verified_then_uses_the_copy_as_it_is(
    s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    objects = _checkpoint(s3, s3_bucket, SIZES)
    dest = tmp_path / "out" / "checkpoint-4"
    done = restore(objects, dest, client=s3, max_workers=4, part_bytes=256 * 1024)
    assert done.source == "store" and done.fetched_bytes == sum(SIZES.values())
    for obj in objects:
        assert hashlib.sha256((dest / obj.relative).read_bytes()).hexdigest() == obj.sha256
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == [
        ".checkpoint-4.restore.lock"
    ]
    assert json.loads((dest / MANIFEST).read_text())
    # a second start on this node: our verified copy, not downloaded again
    assert restore(objects, dest, client=s3).source == "manifest"
    # the node's own copy without our manifest: hashed in place, used as it is
    (dest / MANIFEST).unlink()
    assert restore(objects, dest, client=s3).source == "local"
    # a damaged local copy is replaced by a verified one
    (dest / "optimizer.pt").write_bytes(b"\0" * SIZES["optimizer.pt"])
    assert restore(objects, dest, client=s3).source == "store"
    assert hashlib.sha256((dest / "optimizer.pt").read_bytes()).hexdigest() == objects[1].sha256


def test_each_part_is_one_get_and_the_get_threads_do_nothing_else(
    s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # GIVEN a checkpoint of three objects (one empty) and a hook on the client that sees every
    # request it sends
    objects = _checkpoint(s3, s3_bucket, SIZES)
    part = 256 * 1024
    sent: list[tuple[str, str]] = []

    def count(model: Any, **_: Any) -> None:
        sent.append((model.name, threading.current_thread().name))

    s3.meta.events.register("before-call.s3", count, unique_id="test-restore-count")
    trace = FetchTrace()
    try:
        # WHEN it is restored
        restore(objects, tmp_path / "checkpoint-4", client=s3, max_workers=4, part_bytes=part,
                trace=trace)  # fmt: skip
    finally:
        s3.meta.events.unregister("before-call.s3", unique_id="test-restore-count")
    # THEN every part is one ranged GET and nothing else is asked (no HEAD, no listing; the
    # empty object needs none)
    parts = sum(-(-size // part) for size in SIZES.values())
    assert [name for name, _ in sent] == ["GetObject"] * parts and trace.requests == parts
    # AND the threads that send GETs never write, hash or start a write-back: one held by the
    # disk or the digest is a request not in flight (at 1 GB on LocalStack 7.5-9.4 of 16 were,
    # BENCHMARKS.md section 9)
    get_threads = {thread for _, thread in sent}
    assert get_threads == trace.threads["get"]
    assert all(name.startswith("restore-get") for name in get_threads)
    others = trace.threads["write"] | trace.threads["hash"] | trace.threads["writeback"]
    assert trace.threads["write"] and trace.threads["writeback"] and not get_threads & others
    assert trace.threads["fsync"] == {threading.current_thread().name}  # the caller's, at the end


def test_an_object_that_is_not_its_report_fails_the_restore_and_leaves_nothing(
    s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    objects = _checkpoint(s3, s3_bucket, SIZES)
    wrong = objects[1]
    objects[1] = RemoteObject(wrong.uri, wrong.relative, wrong.bytes, "0" * 64)
    dest = tmp_path / "checkpoint-4"
    with pytest.raises(RestoreError, match=r"optimizer\.pt: sha256 .* reported 0000"):
        restore(objects, dest, client=s3, part_bytes=64 * 1024)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".checkpoint-4.restore.lock"]
    # a shorter object than reported (replaced meanwhile, ETag pin dropped)
    objects[1] = RemoteObject(wrong.uri, wrong.relative, wrong.bytes + 1, wrong.sha256)
    with pytest.raises(RestoreError, match=r"optimizer\.pt"):
        restore(objects, dest, client=s3, part_bytes=64 * 1024)
    assert not dest.exists()


def test_a_one_file_checkpoint_is_restored_to_a_file(
    s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    obj = _put(s3, s3_bucket, "job/epoch=0-step=4.ckpt", os.urandom(70_000))
    dest = tmp_path / "epoch=0-step=4.ckpt"
    assert restore([obj], dest, client=s3, part_bytes=16 * 1024).source == "store"
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == obj.sha256
    assert restore([obj], dest, client=s3).source == "manifest"


def test_relative_names_stay_inside_the_checkpoint() -> None:
    assert relative_name("s3://b/j/checkpoint-4", "s3://b/j/checkpoint-4/a/b.pt") == "a/b.pt"
    assert relative_name("s3://b/j/x.ckpt", "s3://b/j/x.ckpt") == ""
    for bad in (
        "s3://b/j/checkpoint-40/a",
        "s3://b/j/checkpoint-4/../x",
        "s3://b/j/checkpoint-4//a",
    ):
        with pytest.raises(RestoreError, match="uri"):
            relative_name("s3://b/j/checkpoint-4", bad)


def test_a_newer_committed_checkpoint_in_the_listing_is_named() -> None:
    point = ResumePoint("j", 6, 0, 0, 2, {0: "s3://b/j/checkpoint-6"}, "s3://b/j/checkpoint-6")
    listing = ["checkpoint-6/trainer_state.json", "checkpoint-9/model.safetensors"]
    assert newer_in_listing(point, listing) is None  # checkpoint-9 never committed
    assert newer_in_listing(point, [*listing, "checkpoint-9/trainer_state.json"]) == (
        9,
        "checkpoint-9/",
    )
    assert newer_in_listing(point, ["step-8/__0_0.distcp", "step-8/.metadata"]) == (8, "step-8/")


_CHILD = """
import json, sys
from pathlib import Path
from trainer_client.storage.restore import RemoteObject, restore
import boto3
args = json.loads(sys.argv[1])
client = boto3.session.Session().client("s3")
objects = [RemoteObject(**o) for o in args["objects"]]
print(restore(objects, Path(args["dest"]), client=client, max_workers=1,
              part_bytes=args["part"]).source, flush=True)
"""


@pytest.mark.slow
def test_a_restore_killed_midway_leaves_no_loadable_directory_and_the_next_start_completes_it(
    s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    from transformers.trainer_utils import get_last_checkpoint

    objects = _checkpoint(s3, s3_bucket, {"model.safetensors": 24 * 1024 * 1024, "a.json": 10})
    out = tmp_path / "out"
    dest = out / "checkpoint-4"
    args = {"objects": [o.__dict__ for o in objects], "dest": str(dest), "part": 64 * 1024}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(args)], env=child_env(), cwd=REPO_ROOT
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            partial = list(out.glob(".checkpoint-4.restoring-*/model.safetensors"))
            if partial and partial[0].stat().st_blocks > 0:
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    # THEN only a hidden temporary directory: nothing HF (or DCP) would take for a checkpoint
    assert not dest.exists()
    assert [p.name.startswith(".") for p in out.iterdir()] == [True] * len(list(out.iterdir()))
    assert get_last_checkpoint(str(out)) is None  # type: ignore[no-untyped-call]
    # AND the next start removes it and completes the restore
    done = restore(objects, dest, client=s3, part_bytes=1024 * 1024)
    assert done.source == "store"
    assert sorted(p.name for p in out.iterdir()) == [".checkpoint-4.restore.lock", "checkpoint-4"]
