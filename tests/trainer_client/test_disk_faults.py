"""Real disk faults under the spool: a full tmpfs, short writes (RLIMIT_FSIZE), a read-only
directory. A report whose ``report()`` returned survives; the others raise ``SpoolUnwritable``.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_pipeline.local.sqs_server import PipelineQueues
from tests.torchrun import free_port
from tests.trainer_client.helpers import REPO_ROOT, child_env, drain
from trainer_client import CheckpointReporter, ReporterConfigError
from trainer_client.exceptions import SpoolUnwritable
from trainer_client.report.spool import Spool

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a real full disk (ENOSPC and short writes from the kernel)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _reporter(queue_url: str, spool: Path, **kw: Any) -> CheckpointReporter:
    return CheckpointReporter(
        queue_url,
        job_id="disk-job",
        spool_dir=spool,
        rank=0,
        world_size=1,
        spot_poll=False,
        install_signal_handler=False,
        **kw,
    )


def _fill(rep: CheckpointReporter) -> list[int]:
    returned: list[int] = []
    for step in range(10_000):
        try:
            rep.report(step=step, epoch=0, uri=f"s3://b/{step}", extra={"pad": "p" * 1500})
        except SpoolUnwritable as exc:
            assert exc.errno == errno.ENOSPC and exc.filename == rep.spool_path
            return returned
        returned.append(step)
    raise AssertionError("the 64 KiB disk never filled")


@needs_root
def test_full_disk_raises_typed_error_and_keeps_every_returned_report(
    small_disk: Path, pipeline_queues: PipelineQueues, sqs: Any
) -> None:
    # GIVEN SQS unreachable and the spool on a 64 KiB disk, reported until the disk refuses
    closed = f"http://127.0.0.1:{free_port()}"
    rep = _reporter(pipeline_queues.queue_url, small_disk, endpoint_url=closed)
    returned = _fill(rep)
    assert returned and rep.pending == len(returned)
    with pytest.raises(SpoolUnwritable):  # still full: still refused, nothing half-written
        rep.report(step=99_999, epoch=0, uri="s3://b/x", extra={"pad": "p" * 1500})
    rep.close(timeout=0.1)
    # WHEN the trainer restarts with the disk still full, against a reachable SQS
    with _reporter(pipeline_queues.queue_url, small_disk) as again:
        assert again.pending == len(returned)  # the constructor copes with the full disk
        assert again.flush(20)
    # THEN every report whose report() returned arrived, once
    messages = drain(sqs, pipeline_queues.queue_url, expect=len(returned))
    assert sorted(json.loads(m["Body"])["step"] for m in messages) == returned


@needs_root
def test_compaction_on_a_full_disk_never_replaces_the_spool(small_disk: Path) -> None:
    # GIVEN a spool that filled the disk, half of it acknowledged (compaction is due)
    spool = Spool(small_disk, 0, max_bytes=1 << 20, max_records=10_000, compact_threshold_bytes=1)
    seqs: list[int] = []
    with pytest.raises(SpoolUnwritable):
        while True:
            seqs.append(spool.append(json.dumps({"n": len(seqs), "pad": "q" * 1500})))
    # WHEN acks arrive: compaction needs room for a temp copy the disk cannot give
    acked = seqs[: 2 * len(seqs) // 3]
    spool.ack(acked)
    assert spool.pending_count == len(seqs) - len(acked)  # not re-sent while the disk is full
    spool.close()
    # THEN every un-acked record is still there after a reopen (acked ones the full disk kept
    # out of the ack log may come back too: a resend SQS deduplicates, never a loss)
    reopened = Spool(
        small_disk, 0, max_bytes=1 << 20, max_records=10_000, compact_threshold_bytes=1
    )
    left = [r.seq for r in reopened.peek(10_000)]
    assert left == sorted(left) and set(seqs[len(acked) :]) <= set(left) <= set(seqs)
    assert not (small_disk / "rank-0.spool.tmp").exists()
    reopened.close()


_SHORT_WRITE_CHILD = """
import json, resource, signal, sys
from pathlib import Path
from trainer_client.report.spool import Spool
from trainer_client.exceptions import SpoolUnwritable
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # EFBIG / short writes instead of death
spool = Spool(Path(sys.argv[1]), 0, max_bytes=1 << 30, max_records=1 << 20,
              compact_threshold_bytes=1 << 30)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
returned = []
try:
    while True:
        returned.append(spool.append(json.dumps({"n": len(returned), "pad": "z" * 700})))
except SpoolUnwritable as exc:
    print(json.dumps({"returned": returned, "errno": exc.errno}), flush=True)
"""


@pytest.mark.parametrize("limit", [4096, 10_000, 20_001])
def test_short_writes_under_rlimit_fsize_keep_exactly_the_returned_records(
    tmp_path: Path, limit: int
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SHORT_WRITE_CHILD, str(tmp_path), str(limit)],
        env=child_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["errno"] == errno.EFBIG
    spool = Spool(tmp_path, 0, max_bytes=1 << 30, max_records=1 << 20, compact_threshold_bytes=1)
    assert [r.seq for r in spool.peek(1 << 20)] == result["returned"]
    assert all(json.loads(r.body)["n"] == r.seq for r in spool.peek(1 << 20))
    spool.close()


def test_read_only_spool_directory_is_a_config_error(
    tmp_path: Path, pipeline_queues: PipelineQueues
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], check=False)
    try:
        if os.access(ro, os.W_OK) and os.geteuid() != 0:
            ro.chmod(0o500)
        with pytest.raises(ReporterConfigError, match="spool_dir"):
            _reporter(pipeline_queues.queue_url, ro)
    finally:
        subprocess.run(["umount", str(ro)], check=False, capture_output=True)
