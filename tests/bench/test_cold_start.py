"""bench.cold_start's runtime-version layout: the bundle for the Lambda runtime's Python, built for
this host and run by that interpreter in the native Debian root (``ROOT_ARCH=amd64
.ci/setup-arm64.sh``), imports the handler and writes a real first batch (not a measurement)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psycopg
import pytest

from bench import cold_start
from bench._harness import migrated_database
from tests.conftest import ADMIN_URL

ROOT = Path(os.environ.get("AMD64_ROOT", "/var/cache/ckpt-pipeline/amd64-root"))
MARKER = ROOT / ".ckpt-amd64-complete"  # written last by .ci/setup-arm64.sh


def _unavailable() -> str | None:
    if platform.machine() != "x86_64":
        return "the native runtime root is built for x86_64 hosts"
    if os.geteuid() != 0:
        return "the runtime root needs root (chroot)"
    if not MARKER.is_file():
        return f"no native runtime root at {ROOT}: run `ROOT_ARCH=amd64 bash .ci/setup-arm64.sh`"
    return None


@pytest.mark.slow
@pytest.mark.skipif(
    _unavailable() is not None and not os.environ.get("CI"), reason=str(_unavailable())
)
def test_runtime_python_layout_imports_and_writes_a_first_batch(tmp_path: Path) -> None:
    assert _unavailable() is None, _unavailable()  # in CI the root must be there (make test)
    # GIVEN the bundle for the runtime's Python, byte-compiled by the root's interpreter
    layout = cold_start.runtime_layout(tmp_path, ROOT)
    try:
        assert layout.root == ROOT
        assert list(
            (layout.path / "lambda_writer" / "writer" / "__pycache__").glob(
                "handler.cpython-314.pyc"
            )
        )
        event = tmp_path / "event.json"
        cold_start.write_event(event)
        # WHEN that interpreter imports the handler and runs one real SQS event of 10 reports
        with migrated_database(ADMIN_URL) as url:
            imported, batch = cold_start.run_layout(layout, cold_start._FIRST_BATCH, event, url)
            with psycopg.connect(url) as conn:
                shards = conn.execute("SELECT count(*) FROM training_checkpoint_shards").fetchone()
        # THEN both are timed and all 10 rows are in the database (the script also asserted an
        # empty batchItemFailures)
        assert imported > 0 and batch > 0
        assert shards == (10,)
    finally:
        cold_start.unlock(tmp_path)
