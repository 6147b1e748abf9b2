"""The distribution installs by role: the base is the trainer client and nothing else.

Builds the wheel from this tree, installs it into fresh virtual environments (no access to the dev
venv's packages) and runs the installed code against moto's SQS server and the real PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
import venv
from pathlib import Path
from typing import Any

import pytest

from ckpt_contract import decode
from ckpt_pipeline.local.sqs_server import PipelineQueues, create_pipeline_queues

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# What a training image must not get from the base install.
HEAVY = ("psycopg", "moto", "aws_cdk", "rich", "torch", "aws_lambda_powertools", "lightning",
         "transformers", "accelerate")  # fmt: skip
SOURCES = ("pyproject.toml", "README.md", "ckpt_contract", "trainer_client", "lambda_writer",
           "ckpt_pipeline", "infra")  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of this tree (the build leaves nothing in the checkout)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        check=True,
    )  # fmt: skip
    (built,) = out.glob("ckpt_pipeline-*.whl")
    return built


def _venv_with(tmp: Path, requirement: str) -> Path:
    """A fresh venv (no system site-packages) with ``requirement`` installed; returns its bin."""
    venv.EnvBuilder(with_pip=True, clear=True).create(tmp)
    bin_dir = tmp / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         requirement],
        check=True,
    )  # fmt: skip
    return bin_dir


@pytest.fixture(scope="module")
def base_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv_with(tmp_path_factory.mktemp("base-venv"), str(wheel))


@pytest.fixture(scope="module")
def ops_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv_with(tmp_path_factory.mktemp("ops-venv"), f"{wheel}[ops]")


def _importable(bin_dir: Path, modules: tuple[str, ...]) -> dict[str, bool]:
    code = (
        "import importlib.util, json, sys;"
        "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))"
    )
    out = subprocess.run(
        [str(bin_dir / "python"), "-c", code, *modules], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, bool] = json.loads(out)
    return result


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(extra)
    return env


@pytest.fixture
def queues(sqs: Any) -> PipelineQueues:
    return create_pipeline_queues(sqs, prefix=f"pkg{uuid.uuid4().hex[:8]}")


def test_base_install_is_the_trainer_client_alone(base_bin: Path) -> None:
    found = _importable(base_bin, ("trainer_client", "ckpt_contract", "boto3", "pydantic", *HEAVY))
    assert found == {
        "trainer_client": True,
        "ckpt_contract": True,
        "boto3": True,
        "pydantic": True,
        **dict.fromkeys(HEAVY, False),
    }


def test_base_install_reports_to_sqs(
    base_bin: Path, queues: PipelineQueues, sqs: Any, tmp_path: Path
) -> None:
    # GIVEN only the base install WHEN a rank reports THEN the message is on the queue, valid.
    script = textwrap.dedent(
        """
        import sys
        from trainer_client import CheckpointReporter
        with CheckpointReporter(queue_url=sys.argv[1], job_id="pkg-job", spool_dir=sys.argv[2],
                                rank=0, world_size=1) as reporter:
            reporter.report(step=7, epoch=1, uri="file:///ckpt/7/rank0.pt", loss=0.25)
            assert reporter.flush(timeout=30), "flush did not finish"
        """
    )
    subprocess.run(
        [str(base_bin / "python"), "-c", script, queues.queue_url, str(tmp_path / "spool")],
        check=True,
        env=_env({}),
        timeout=120,
    )
    received = sqs.receive_message(QueueUrl=queues.queue_url, MaxNumberOfMessages=10)
    (message,) = received["Messages"]
    report = decode(message["Body"])
    assert (report.job_id, report.step, report.rank, report.loss) == ("pkg-job", 7, 0, 0.25)


def test_base_install_names_the_extra_an_operator_command_needs(base_bin: Path) -> None:
    done = subprocess.run(
        [str(base_bin / "ckpt-pipeline"), "status"],
        capture_output=True,
        text=True,
        env=_env({"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/postgres"}),
    )
    assert done.returncode == 2
    assert "needs the 'ops' extra" in done.stderr
    assert "Traceback" not in done.stderr


def test_ops_extra_runs_status_and_replay_without_the_local_stand_in(
    ops_bin: Path, queues: PipelineQueues, sqs: Any, clean_db: str
) -> None:
    found = _importable(ops_bin, ("psycopg", "rich", "moto", "aws_cdk", "torch", "psycopg_pool"))
    assert found == {"psycopg": True, "rich": True, "moto": False, "aws_cdk": False,
                     "torch": False, "psycopg_pool": False}  # fmt: skip
    body = json.dumps({"schema": "ckpt.v1", "job_id": "x"})  # poison: fails validation
    sqs.send_message(
        QueueUrl=queues.dlq_url, MessageBody=body, MessageGroupId="g", MessageDeduplicationId="d"
    )
    env = _env({"DATABASE_URL": clean_db, "CKPT_QUEUE_URL": queues.queue_url,
                "DLQ_URL": queues.dlq_url})  # fmt: skip
    status = subprocess.run(
        [str(ops_bin / "ckpt-pipeline"), "status", "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["dlq"]["visible"] == 1
    replay = subprocess.run(
        [str(ops_bin / "ckpt-pipeline"), "replay-dlq", "--dry-run"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert "1" in replay.stdout.splitlines()[-1]
