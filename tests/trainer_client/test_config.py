"""Configuration is resolved and validated at construction; errors name the variable and rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_client.config import ReporterConfig, Tuning, resolve_config
from trainer_client.exceptions import ReporterConfigError

URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/prod-checkpoints.fifo"


def _resolve(env: dict[str, str], **kw: object) -> ReporterConfig:
    args: dict[str, object] = {
        "queue_url": None,
        "job_id": None,
        "spool_dir": None,
        "rank": None,
        "world_size": None,
        "run_attempt": None,
        "endpoint_url": None,
        "region": None,
        "tuning": Tuning(spot_poll=False),
    }
    args.update(kw)
    return resolve_config(env=env, **args)  # type: ignore[arg-type]


def test_torchrun_environment_is_enough(tmp_path: Path) -> None:
    env = {
        "CKPT_QUEUE_URL": URL,
        "TORCHELASTIC_RUN_ID": "run-42",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "RANK": "3",
        "WORLD_SIZE": "8",
        "CKPT_SPOOL_DIR": str(tmp_path),
    }
    config = _resolve(env)
    assert (config.job_id, config.rank, config.world_size, config.run_attempt) == (
        "run-42",
        3,
        8,
        2,
    )
    assert config.region == "eu-west-1"


def test_job_id_precedence_and_defaults(tmp_path: Path) -> None:
    env = {"CKPT_JOB_ID": "a", "TORCHELASTIC_RUN_ID": "b", "SLURM_JOB_ID": "c"}
    base = {"queue_url": URL, "spool_dir": tmp_path, "rank": 0, "world_size": 1}
    assert _resolve(env, **base).job_id == "a"
    assert _resolve({"SLURM_JOB_ID": "77"}, **base).job_id == "77"
    assert _resolve(env, job_id="explicit", **base).job_id == "explicit"
    assert _resolve({}, job_id="j", **base).run_attempt == 0


Q = {"CKPT_QUEUE_URL": URL}
# What torchrun --standalone sets: a uuid4 drawn at every invocation.
RANDOM_RUN_ID = "0b5f2a4e-9c1d-4e7b-8a3f-2d6c9e1b7a40"


def test_a_random_run_id_is_passed_over_for_a_stable_one(tmp_path: Path) -> None:
    # GIVEN torchrun's random run id beside SLURM's job id (kept by a requeue)
    env = {"TORCHELASTIC_RUN_ID": RANDOM_RUN_ID, "SLURM_JOB_ID": "4242"}
    base = {"queue_url": URL, "spool_dir": tmp_path, "rank": 0, "world_size": 1}
    # THEN the job is SLURM's, which names the job across launches
    assert _resolve(env, **base).job_id == "4242"
    # AND a run id of the user's own (--rdzv-id) is taken as before
    assert _resolve({"TORCHELASTIC_RUN_ID": "llama-8b"}, **base).job_id == "llama-8b"


def _k(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"job_id": "j", "spool_dir": "/x", "rank": 0, "world_size": 1}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    ("env", "kw", "name", "rule"),
    [
        ({}, _k(), "queue_url", "CKPT_QUEUE_URL"),
        ({"CKPT_QUEUE_URL": "https://sqs.x/1/q"}, _k(), "CKPT_QUEUE_URL", "FIFO"),
        (Q, _k(job_id=None), "job_id", "CKPT_JOB_ID"),
        ({**Q, "TORCHELASTIC_RUN_ID": "none"}, _k(job_id=None), "TORCHELASTIC_RUN_ID", "--rdzv-id"),
        ({**Q, "TORCHELASTIC_RUN_ID": RANDOM_RUN_ID}, _k(job_id=None), "CKPT_JOB_ID", "random id"),
        ({**Q, "CKPT_JOB_ID": "bad id!"}, _k(job_id=None), "CKPT_JOB_ID", "A-Za-z0-9"),
        (Q, _k(job_id=".."), "job_id", "'..'"),
        (Q, _k(spool_dir=None), "spool_dir", "CKPT_SPOOL_DIR"),
        (Q, _k(rank=None), "rank", "RANK"),
        (Q, _k(rank=8, world_size=8), "rank", "rank < world_size (8)"),
        ({**Q, "RANK": "x"}, _k(rank=None), "RANK", "integer"),
        ({**Q, "RANK": "1"}, _k(rank=2, world_size=4), "rank", "RANK says 1 but rank= says 2"),
        (Q, _k(run_attempt=-1), "run_attempt", ">= 0"),
        (Q, _k(tuning=Tuning(batch_size=11)), "batch_size", "1..10"),
        (Q, _k(tuning=Tuning(close_timeout_s=float("nan"))), "close_timeout_s", "finite"),
        (Q, _k(tuning=Tuning(hash_threads=0)), "hash_threads", "1..64, or None"),
        (Q, _k(tuning=Tuning(finisher_priority="lowest")), "finisher_priority", "idle, low"),
        (Q, _k(tuning=Tuning(finisher_nice=20)), "finisher_nice", "0..19"),
        (Q, _k(tuning=Tuning(writeback_slice_bytes=-1)), "writeback_slice_bytes", ">= 0"),
        (Q, _k(tuning=Tuning(max_bandwidth=1000.0)), "max_bandwidth", ">= 1048576"),
        (Q, _k(tuning=Tuning(max_bandwidth=float("inf"))), "max_bandwidth", "bytes per second"),
        (Q, _k(tuning=Tuning(step_pause_s=-0.1)), "step_pause_s", "0..60"),
        (Q, _k(tuning=Tuning(drop_page_cache="no")), "drop_page_cache", "True or False"),  # type: ignore[arg-type]
    ],
)
def test_errors_name_the_setting_and_rule(
    env: dict[str, str], kw: dict[str, object], name: str, rule: str
) -> None:
    with pytest.raises(ReporterConfigError) as info:
        _resolve(env, **kw)
    assert info.value.name == name
    assert rule in str(info.value)


def test_the_region_comes_from_the_given_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a queue URL without a Region, the Region in the environment passed in, another one in
    # this process's own environment
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    env = {
        "CKPT_QUEUE_URL": "http://localhost:4566/000000000000/ckpt.fifo",
        "CKPT_JOB_ID": "job",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "CKPT_SPOOL_DIR": str(tmp_path),
        "AWS_REGION": "ap-south-1",
    }
    # WHEN resolved THEN the given environment's Region is the one used
    assert _resolve(env).region == "ap-south-1"
    # AND AWS_REGION comes before AWS_DEFAULT_REGION, as in the CDK CLI and the operator tools
    assert _resolve({**env, "AWS_DEFAULT_REGION": "eu-west-1"}).region == "ap-south-1"
    # AND without one there, none is taken from the process (boto3 then reads its own)
    assert _resolve({k: v for k, v in env.items() if k != "AWS_REGION"}).region is None
