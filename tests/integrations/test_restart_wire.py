"""The restart's fixed-size collectives (trainer_client/restart/wire.py): the pure
encodings, then four real gloo ranks agreeing through them, and the decision's table reaching
only each node's first rank (wire_table.py)."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

from ckpt_contract.restart import SkippedCandidate
from tests.integrations import wire_table_job
from tests.torchrun import free_port
from trainer_client.report.launch import Launch
from trainer_client.restart.decide import Decision
from trainer_client.restart.lookup import ResumePoint
from trainer_client.restart.wire import ranges
from trainer_client.restart.wire_decision import from_bytes, to_bytes
from trainer_client.storage.restore import RemoteObject

ROOT = Path(__file__).resolve().parents[2]


def test_missing_ranks_become_at_most_the_limit_of_ranges_covering_every_one() -> None:
    assert ranges([5, 1, 2, 3, 9]) == [(1, 3), (5, 5), (9, 9)]
    # WHEN there are more runs than the limit THEN the smallest gaps are merged: a superset
    merged = ranges([0, 2, 10, 11, 30], limit=2)
    assert merged == [(0, 11), (30, 30)]
    assert all(any(a <= r <= b for a, b in merged) for r in [0, 2, 10, 11, 30])


def test_the_decision_survives_its_wire_form_and_its_size_follows_the_objects_only() -> None:
    root = "s3://b/job/step-9"
    objects = tuple(
        RemoteObject(f"{root}/__{r}_0.distcp", f"__{r}_0.distcp", 100 + r, f"{r:064x}", "v", '"e"')
        for r in range(64)
    )
    point = ResumePoint("job", 9, 0, 2, 64, {r: root for r in range(64)}, root)
    decision = Decision(
        point,
        objects,
        "/out/step-9",
        launch=Launch(3, "a" * 32, "restart"),
        skipped=(SkippedCandidate(step=12, kind="incomplete", reason="r", missing_ranks=[1]),),
        newest_step=12,
        unwritten=((12, 2, 5),),
        unwritten_count=7,
        store_newer=(13, f"{root}x"),
    )
    assert from_bytes(to_bytes(decision)) == decision
    # the ranks' one shared URI travels once
    wide = ResumePoint("job", 9, 0, 2, 4096, {r: root for r in range(4096)}, root)
    assert len(to_bytes(Decision(wide))) < len(to_bytes(Decision(point))) + 16
    assert from_bytes(to_bytes(Decision(None, error="x"))) == Decision(None, error="x")


def _rank(rank: int, world: int, port: int, out: Any) -> None:
    import time

    import torch.distributed as dist

    from trainer_client.restart.wire import (
        all_succeeded,
        broadcast_bytes,
        summarize,
        wait_written,
    )

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    # rank r holds (step 20, attempt 1) and rank 3 also (step 10, attempt 0); ranks 1 and 3 left
    # reports unsent; rank 2 already reports as a launch
    mine = {(20, 1)} | ({(10, 0)} if rank == 3 else set())
    summary = summarize(
        dist,
        rank=rank,
        in_flight=mine,
        recorded_attempt=rank,
        unsent=rank if rank in (1, 3) else 0,
        send_error=f"Err{rank}" if rank in (1, 3) else None,
        began=(4, "store") if rank == 2 else None,
    )
    rounds = [0]

    def poll() -> list[list[int]]:
        # rank 3's report of step 20 is missing for two rounds; rank 3's step 10 stays missing
        rounds[0] += 1
        return [[3] if rounds[0] <= 2 else [], [3]]

    missing = wait_written(
        dist,
        rank=rank,
        slots=summary.slots,
        mine=mine,
        poll=poll if rank == 0 else None,
        deadline=time.monotonic() + 1.0,
    )
    wire = broadcast_bytes(dist, b"decision" if rank == 0 else None)
    failed = all_succeeded(dist, rank=rank, failed=rank in (2, 3))
    out.put((rank, summary, missing, rounds[0], wire, failed))
    dist.destroy_process_group()


def test_four_gloo_ranks_agree_through_fixed_size_collectives() -> None:
    # torch imported once here and forked, as tests/integrations/ranks.py launches its ranks
    import torch.distributed  # noqa: F401

    world = 4
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, out)) for r in range(world)]
    for proc in procs:
        proc.start()
    results = sorted((out.get(timeout=300) for _ in procs), key=lambda r: r[0])
    for proc in procs:
        proc.join(30)
    zero = results[0]
    summary = zero[1]
    # THEN rank 0 knows every rank's state as sums, minima and maxima
    assert summary.began == (2, "attempt 4 (store)")
    assert summary.recorded_attempt == 3
    assert (summary.unsent, summary.unsent_rank, summary.send_error) == (4, 1, "Err1")
    assert summary.waited == 5 and summary.slots == ((20, 1), (10, 0))
    # AND the wait ended at the deadline with rank 3's report of step 10 the one missing
    assert {r[2] for r in results} == {(1, (10, 0, 3))}
    assert zero[3] >= 3
    # AND every rank holds the decision's bytes, and knows 2 ranks failed, the first rank 2
    assert {r[4] for r in results} == {b"decision"}
    assert {r[5] for r in results} == {(2, 2)}


def test_only_a_nodes_first_rank_receives_rows_and_only_its_nodes(tmp_path: Path) -> None:
    # GIVEN 4 gloo ranks as 2 nodes of 2, forked from a fresh process (wire_table_job.py)
    command = [sys.executable, "-m", "tests.integrations.wire_table_job", str(tmp_path)]
    assert subprocess.run(command, cwd=ROOT, timeout=240, check=False).returncode == 0
    held = {r: json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)}
    common = ["model.safetensors", "trainer_state.json"]
    # WHEN the checkpoint was saved at this world size THEN the non-first ranks receive no row
    # (they know how many objects there are, and that their node's first rank restores)
    for r in (1, 3):
        assert held[r]["4"] == {"rows": [], "objects": 6, "restores": False}
    # AND rank 2 only its node's rows: the common files and ranks 2 and 3's own
    node = [*common, "rng_state_2.pth", "rng_state_3.pth"]
    assert held[2]["4"] == {"rows": node, "objects": 6, "restores": True}
    # AND rank 0, which read the database, holds them all
    assert held[0]["4"]["rows"] == wire_table_job.NAMES
    # WHEN it was saved by 8 ranks (every node fetches everything) THEN every rank holds every row
    assert all(held[r]["8"]["rows"] == wire_table_job.NAMES for r in range(4))
