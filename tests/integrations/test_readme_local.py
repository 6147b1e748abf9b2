"""README.md's quick start on this machine, run as a reader would paste it.

The first line's ``ckpt-pipeline local`` runs as written after ``make setup &&`` (this venv is
that setup), with its own database name on the test server so runs never share one; the other
lines (terminal 2) run in bash as written, in the same directory, with ``train.py`` the README's
Hugging Face `Trainer` block under a tiny model, two saves and the CPU settings the README names
for a machine without GPUs. Then the rows are read back, and Ctrl-C stops the pipeline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ADMIN_URL
from tests.integrations.test_readme_quickstarts import _TINY_HF
from tests.trainer_client.helpers import rows_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SECTION = "## Quick start\n"
BIN = str(Path(sys.executable).parent)


def _screen() -> list[str]:
    section = README[README.index(SECTION) :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: no bash block in the quick start"
    return block.group(1).splitlines()


def _train_py(workdir: Path) -> str:
    block = re.search(r"### Hugging Face `Trainer`\n\n```python\n(.*?)```", README, re.S)
    assert block, "README.md: no Trainer block"
    code = block.group(1)
    assert "save_steps=500" in code
    code = code.replace(
        "save_steps=500",
        'save_steps=2, max_steps=4, report_to=[], use_cpu=True, ddp_backend="gloo"',
    )
    return _TINY_HF + code.replace("/mnt/efs", str(workdir / "efs"))


def test_the_local_quick_start_records_a_two_rank_trainer(tmp_path: Path) -> None:
    first, *terminal_2 = _screen()
    setup, local = first.split("#")[0].split(" && ")
    assert setup == "make setup" and "ckpt-pipeline local" in local, first
    dbname = f"ckpt_readme_{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATABASE_URL"))}
    env.update(CKPT_LOCAL_ADMIN_URL=ADMIN_URL, PYTHONPATH=str(ROOT))
    argv = [*local.replace(".venv/bin/", f"{BIN}/").split(), "--dbname", dbname]
    server = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    env_file = tmp_path / ".ckpt-local.env"
    try:
        deadline = time.monotonic() + 120
        while not env_file.exists():
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "ckpt-pipeline local: no env file in 120 s"
            time.sleep(0.2)
        (tmp_path / "train.py").write_text(_train_py(tmp_path))
        script = "\n".join(terminal_2).replace(".venv/bin/", f"{BIN}/")
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        # The status line may come before the last report is written: the rows decide.
        url = psycopg.conninfo.make_conninfo(ADMIN_URL, dbname=dbname)
        rows = rows_until(
            url,
            "SELECT step, is_complete, shards_present FROM training_checkpoints"
            " WHERE job_id = 'run3' ORDER BY step",
            lambda rows: rows == [(2, True, 2), (4, True, 2)],
        )
        assert rows == [(2, True, 2), (4, True, 2)], done.stdout
        assert re.search(r"run3\s+\d/2\s+\d\b", done.stdout), done.stdout
    finally:
        server.send_signal(signal.SIGINT)
        out, _ = server.communicate(timeout=120)
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    assert server.returncode == 0, out
    assert "export CKPT_QUEUE_URL=" in out and "stopped;" in out
    assert not env_file.exists()
