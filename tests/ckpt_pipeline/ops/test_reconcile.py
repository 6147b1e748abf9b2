"""ckpt-pipeline reconcile: moto's S3 and a directory beside the real database, both ways."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ckpt_pipeline.cli import main
from ckpt_pipeline.local.pipeline import LocalPipeline
from ckpt_pipeline.ops.reconcile import Store, list_store
from ckpt_pipeline.ops.reconcile_backfill import backfill_reports, send_reports
from ckpt_pipeline.ops.reconcile_findings import Backfill
from ckpt_pipeline.ops.reconcile_layout import StoreObject, compile_pattern, group_checkpoints
from tests.e2e.conftest import PipelineFactory
from tests.e2e.helpers import settle
from trainer_client import CheckpointReporter
from trainer_client.restart.lookup import latest_complete_checkpoint

RANKS = 2


@pytest.fixture
def pipeline(pipeline_factory: PipelineFactory) -> Iterator[LocalPipeline]:
    with pipeline_factory() as running:
        yield running


def _obj(relative: str, size: int = 1) -> StoreObject:
    return StoreObject(relative, f"s3://b/p/{relative}", size, 0.0)


# -- layouts (pure) ------------------------------------------------------------------------------


def test_each_layout_our_integrations_write_is_recognised() -> None:
    names = [
        "hf/checkpoint-500/model.safetensors",
        "hf/checkpoint-500/rng_state_0.pth",
        "hf/checkpoint-500/rng_state_1.pth",
        "hf/checkpoint-500/trainer_state.json",
        "hf/checkpoint-600/model.safetensors",  # no trainer_state.json (yet)
        "hf1/checkpoint-3/model.safetensors",  # one process: rng_state.pth, no index
        "hf1/checkpoint-3/rng_state.pth",
        "hf1/checkpoint-3/trainer_state.json",
        "dcp/step-100/__0_0.distcp",
        "dcp/step-100/__1_0.distcp",
        "dcp/step-100/.metadata",
        "dcp/step-200/__0_0.distcp",  # no .metadata: DCP's coordinator has not finished
        "ds/global_step8/mp_rank_00_model_states.pt",  # DeepSpeed ZeRO 2: partitions per rank
        "ds/global_step8/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "ds/global_step8/zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "ds/global_step8/zero_pp_rank_2_mp_rank_00_optim_states.pt",
        "ranks/global_step7/rank-0.pt",
        "ranks/global_step7/rank-1.pt",
        "lightning/epoch=3-step=1200.ckpt",
        "lightning/epoch=0-step=4.ckpt/__0_0.distcp",  # Lightning's sharded save: DCP inside
        "lightning/epoch=0-step=4.ckpt/__1_0.distcp",
        "lightning/epoch=0-step=4.ckpt/.metadata",
        "lightning/epoch=0-step=4.ckpt/meta.pt",
        "lightning/last.ckpt",
        "logs/events.out",
    ]
    checkpoints = group_checkpoints(map(_obj, names))
    found = {(c.step, c.layout, c.location): sorted(c.ranks) for c in checkpoints}
    assert found == {
        (3, "hf", "hf1/checkpoint-3/"): [0],
        (4, "dcp", "lightning/epoch=0-step=4.ckpt/"): [0, 1],
        (7, "per-rank", "ranks/global_step7/"): [0, 1],
        (8, "deepspeed", "ds/global_step8/"): [0, 1, 2],
        (100, "dcp", "dcp/step-100/"): [0, 1],
        (200, "incomplete-dcp", "dcp/step-200/"): [0],
        (500, "hf", "hf/checkpoint-500/"): [0, 1],
        (600, "incomplete-hf", "hf/checkpoint-600/"): [],
        (1200, "lightning", "lightning/epoch=3-step=1200.ckpt"): [],
    }
    # The world size each layout names: its ranks, or none (and why) where it names no rank
    worlds = {c.step: c.world_size or c.no_world_size for c in checkpoints}
    assert worlds == {
        3: 1,
        4: 2,
        7: 2,
        8: 3,
        100: 2,
        200: 1,
        500: 2,
        600: "no file names a rank (no rng_state_<rank>.pth, DCP shards or ZeRO partitions:"
        " save_only_model?)",
        1200: "a lightning layout names no ranks",
    }
    by_step = {c.step: c for c in checkpoints}
    # Files with no rank in their name are rank 0's (DCP's coordinator, the Trainer's saver)
    assert [o.relative for o in by_step[100].ranks[0]] == [
        "dcp/step-100/__0_0.distcp",
        "dcp/step-100/.metadata",
    ]
    assert [o.relative for o in by_step[500].ranks[1]] == ["hf/checkpoint-500/rng_state_1.pth"]
    assert [o.relative.rsplit("/", 1)[1] for o in by_step[8].ranks[0]] == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "mp_rank_00_model_states.pt",
    ]


def test_a_layout_with_gaps_or_model_parallel_files_names_no_world_size() -> None:
    gaps = ["dcp/step-1/__0_0.distcp", "dcp/step-1/__2_0.distcp", "dcp/step-1/.metadata"]
    parallel = ["ds/global_step2/zero_pp_rank_0_mp_rank_01_optim_states.pt"]
    found = {
        c.step: (c.world_size, c.no_world_size)
        for c in group_checkpoints(map(_obj, gaps + parallel))
    }
    assert found[1] == (None, "ranks [0, 2] named, with gaps")
    assert found[2][0] is None and "model-parallel rank other than 00" in found[2][1]


def test_a_pattern_takes_other_layouts_and_must_name_the_step() -> None:
    pattern = compile_pattern(r"ckpt_(?P<step>\d+)/shard(?P<rank>\d+)\.bin$")
    found = group_checkpoints(
        map(_obj, ["ckpt_9/shard0.bin", "ckpt_9/shard1.bin"]), pattern=pattern
    )
    assert [(c.step, c.layout, c.location, sorted(c.ranks)) for c in found] == [
        (9, "pattern", "ckpt_9/", [0, 1])
    ]
    with pytest.raises(ValueError, match="named group"):
        compile_pattern(r"ckpt_(\d+)")


# -- against the store and the database ----------------------------------------------------------


def _report_step(
    pipeline: LocalPipeline, spool: Path, job: str, step: int, uris: dict[int, tuple[str, bytes]]
) -> None:
    for rank, (uri, data) in uris.items():
        with CheckpointReporter(
            pipeline.queues.queue_url,
            job_id=job,
            spool_dir=spool,
            rank=rank,
            world_size=len(uris),
            endpoint_url=pipeline.endpoint_url,
            install_signal_handler=False,
            spot_poll=False,
        ) as reporter:
            reporter.report(
                step=step,
                epoch=0,
                uri=uri,
                bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )
            assert reporter.flush(30)


def _shard_rows(url: str, job: str, step: int) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT rank, uri, size_bytes, extra, objects, sqs_message_id, written_at"
            " FROM training_checkpoint_shards WHERE job_id = %s AND step = %s ORDER BY rank",
            (job, step),
        ).fetchall()


def _env(database_url: str) -> dict[str, str]:
    """The CLI's environment (``main(argv, env)``): this process's, with ``database_url``."""
    return {**os.environ, "DATABASE_URL": database_url}


def _reconcile(
    pipeline: LocalPipeline, *args: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    argv = ["reconcile", "--queue-url", pipeline.queues.queue_url, "--min-age", "0", *args]
    code = main(argv, _env(pipeline.database_url))
    return code, capsys.readouterr().out


@pytest.mark.slow
def test_s3_unreported_and_differing_checkpoints_are_found_and_backfilled(
    pipeline: LocalPipeline,
    s3: Any,
    s3_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = "recon-s3"
    store = f"s3://{s3_bucket}/{job}"
    written: dict[int, dict[int, tuple[str, bytes]]] = {}
    for step in (10, 20, 30):
        written[step] = {}
        for rank in range(RANKS):
            data = os.urandom(8192)
            key = f"{job}/step-{step}/__{rank}_0.distcp"
            s3.put_object(Bucket=s3_bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")
            written[step][rank] = (f"s3://{s3_bucket}/{key}", data)
        s3.put_object(Bucket=s3_bucket, Key=f"{job}/step-{step}/.metadata", Body=b"meta")
    # GIVEN steps 10 and 30 reported, step 20 saved but never reported (the seed's damage), and
    # step 30's rank 1 truncated since
    for step in (10, 30):
        _report_step(pipeline, tmp_path / str(step), job, step, written[step])
    settle(pipeline)
    key = f"{job}/step-30/__1_0.distcp"
    s3.put_object(Bucket=s3_bucket, Key=key, Body=written[30][1][1][:100])
    # WHEN reconciling (a dry run) THEN both kinds are named, nothing is sent
    code, out = _reconcile(pipeline, "--job", job, "--store", store, capsys=capsys)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"unreported  step 20       {store}/step-20/ [dcp]: 3 objects")
    assert lines[0].endswith("(2 reports)")
    assert lines[1] == (
        f"differs     step 30       s3://{s3_bucket}/{job}/step-30/__0_0.distcp:"
        f" s3://{s3_bucket}/{key}: size 100 B, reported 8192 B"
    )
    assert lines[2] == (
        f"reconcile job {job} store {store}/: 3 checkpoints in the store, 2 with rows;"
        " 1 unreported, 0 partial, 1 differing, 0 in flight, 0 pruned, 0 rows elsewhere; dry run"
    )
    assert pipeline.depth() == 0
    # WHEN backfilling THEN step 20 is stored: complete, marked, pinned
    code, out = _reconcile(pipeline, "--job", job, "--store", store, "--backfill", capsys=capsys)
    assert "backfilled 2 reports" in out
    settle(pipeline)
    stored = _shard_rows(pipeline.database_url, job, 20)
    # AND the same backfill again (a re-run racing the first) is the same identities: the
    # writer's replay no-op, nothing changes, not even the message ids
    where = Store.parse(store)
    step20 = next(c for c in group_checkpoints(list_store(where, s3)[0]) if c.step == 20)
    again = backfill_reports(job, Backfill(step20, (0, 1), 2), store=where, s3=s3, run_attempt=0)
    assert send_reports(pipeline.sqs, pipeline.queues.queue_url, again) == 2
    settle(pipeline)
    assert _shard_rows(pipeline.database_url, job, 20) == stored
    rows = [r[:5] for r in stored]
    with psycopg.connect(pipeline.database_url) as conn:
        complete = conn.execute(
            "SELECT is_complete, world_size FROM training_checkpoints"
            " WHERE job_id = %s AND step = 20",
            (job,),
        ).fetchone()
    assert complete == (True, 2)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (0, f"{store}/step-20/", 8192 + 4, {"backfilled": True, "layout": "dcp"}),
        (1, f"{store}/step-20/", 8192, {"backfilled": True, "layout": "dcp"}),
    ]
    assert [o["uri"].rsplit("/", 1)[1] for o in rows[0][4]] == [".metadata", "__0_0.distcp"]
    assert rows[1][4][0]["checksum_algorithm"] == "SHA256"
    # AND the next run finds it reported, the resume takes it (step 30 differs), and the
    # backfilled pins catch a later change like any report's
    code, out = _reconcile(pipeline, "--job", job, "--store", store, "--json", capsys=capsys)
    summary = json.loads(out)
    assert [(f["kind"], f["step"]) for f in summary["findings"]] == [("differs", 30)]
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url, s3_client=s3)
    assert point is not None and (point.step, point.path) == (20, f"{store}/step-20")


@pytest.mark.slow
def test_a_directory_store_and_in_flight_checkpoints(
    pipeline: LocalPipeline,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = "recon-file"
    root = tmp_path / "ckpts"
    (root / "checkpoint-5").mkdir(parents=True)
    (root / "checkpoint-5" / "model.safetensors").write_bytes(b"m" * 100)
    (root / "checkpoint-5" / "rng_state.pth").write_bytes(b"r")  # one process's Trainer
    (root / "checkpoint-5" / "trainer_state.json").write_text("{}")
    lightning = root / "epoch=0-step=9.ckpt"
    lightning.write_bytes(b"l" * 50)
    _report_step(pipeline, tmp_path / "s", job, 9, {0: (lightning.as_uri(), b"l" * 50)})
    settle(pipeline)
    lightning.unlink()
    # A fresh step directory is in flight under the default --min-age.
    argv = ["reconcile", "--job", job, "--store", root.as_uri(), "--json"]
    fresh = main(argv, _env(pipeline.database_url))
    out = json.loads(capsys.readouterr().out)
    assert fresh == 1
    assert [(f["kind"], f["step"]) for f in out["findings"]] == [
        ("in-flight", 5),
        ("differs", 9),
    ]
    assert out["findings"][1]["detail"] == f"{lightning.as_uri()}: missing"
    _, text = _reconcile(
        pipeline, "--job", job, "--store", root.as_uri(), "--backfill", capsys=capsys
    )
    assert "backfilled 1 reports" in text
    settle(pipeline)
    point = latest_complete_checkpoint(job, database_url=pipeline.database_url)
    assert point is not None and (point.step, point.path) == (5, str(root / "checkpoint-5"))


def test_bad_options_are_refused_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, message in (
        (
            ["--job", "j", "--store", "gs://b/p"],
            "--store: must be s3://bucket[/prefix] or file:///dir",
        ),
        (["--job", "bad job", "--store", "s3://b"], "--job: must be 1-128 chars"),
        (["--job", "j", "--store", "s3://b", "--pattern", "x"], "--pattern: needs a named group"),
        (["--job", "j", "--store", "s3://b", "--min-age", "-1"], "--min-age: must be 0 or more"),
    ):
        assert main(["reconcile", *argv], _env("postgresql://u@127.0.0.1:1/db")) == 2
        assert message in capsys.readouterr().err
