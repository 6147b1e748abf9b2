"""The retention planner (pure): what a policy keeps, removes, and refuses."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt_pipeline.ops.prune_objects import ShardObject, objects_to_delete
from lambda_writer.prune.exceptions import PolicyError
from lambda_writer.prune.policy import CheckpointRow, RetentionPolicy, plan_job


def cp(
    step: int,
    *,
    complete: bool = True,
    value: float | None = None,
    attempt: int = 0,
    superseded: int = 0,
) -> CheckpointRow:
    return CheckpointRow(step, attempt, 2, complete, 2 + superseded, superseded, value)


def removed(states: list[CheckpointRow], **policy: Any) -> list[int]:
    plan = plan_job("j", states, RetentionPolicy(**policy))
    return [r.step for r in plan.remove]


def test_keep_last_keeps_the_newest_complete_and_everything_in_progress() -> None:
    states = [cp(s) for s in (1, 2, 3, 4)] + [cp(5, complete=False), cp(6, complete=False)]
    assert removed(states, keep_last=2) == [1, 2]


def test_abandoned_partials_older_than_the_latest_complete_go() -> None:
    states = [cp(1), cp(2, complete=False), cp(3)]
    assert removed(states, keep_last=1) == [1, 2]


def test_a_job_without_a_complete_checkpoint_loses_nothing() -> None:
    states = [cp(1, complete=False), cp(2, complete=False, superseded=3)]
    plan = plan_job("j", states, RetentionPolicy(keep_last=1, superseded=True))
    assert plan.is_empty and plan.latest_complete is None


def test_best_k_by_min_and_max_ties_to_the_newer_step() -> None:
    states = [cp(1, value=0.5), cp(2, value=0.1), cp(3, value=0.1), cp(4, value=0.9), cp(5)]
    # min: 0.1 twice (steps 3 then 2); max: 0.9, then 0.5
    assert removed(states, keep_last=1, keep_best=1, metric="loss") == [1, 2, 4]
    assert removed(states, keep_last=1, keep_best=2, metric="loss", mode="max") == [2, 3]


def test_checkpoints_without_a_value_are_never_best() -> None:
    states = [cp(1), cp(2, value=3.0), cp(3)]
    assert removed(states, keep_last=1, keep_best=2, metric="acc") == [1]


def test_keep_every_and_protected_steps() -> None:
    states = [cp(s) for s in range(10, 101, 10)]
    plan = plan_job("j", states, RetentionPolicy(keep_last=1, keep_every=40), protected={20: "x"})
    assert [r.step for r in plan.remove] == [10, 30, 50, 60, 70, 90]
    assert plan.kept[20] == ("x",) and plan.kept[80] == ("keep-every",)
    assert plan.kept[100] == ("latest complete", "keep-last")


def test_superseded_rows_of_kept_checkpoints_up_to_the_latest_complete() -> None:
    states = [
        cp(1, superseded=1),
        cp(2, superseded=2, attempt=3),
        cp(3, complete=False, superseded=4),
    ]
    plan = plan_job("j", states, RetentionPolicy(superseded=True))
    assert plan.remove == ()
    assert [(r.step, r.run_attempt, r.shard_rows) for r in plan.superseded] == [
        (1, 0, 1),
        (2, 3, 2),
    ]


@given(
    steps=st.lists(
        st.tuples(st.booleans(), st.one_of(st.none(), st.floats(0, 10))), min_size=1, max_size=30
    ),
    keep_last=st.integers(1, 5),
    keep_best=st.integers(0, 3),
)
def test_never_the_latest_complete_the_best_or_anything_newer(
    steps: list[tuple[bool, float | None]], keep_last: int, keep_best: int
) -> None:
    states = [cp(i, complete=c, value=v) for i, (c, v) in enumerate(steps)]
    policy = RetentionPolicy(
        keep_last=keep_last, keep_best=keep_best, metric="loss" if keep_best else None
    )
    gone = set(removed(states, **vars(policy)))
    complete = [s.step for s in states if s.is_complete]
    if not complete:
        assert gone == set()
        return
    assert not gone & set(complete[-keep_last:])
    assert all(step < complete[-1] for step in gone)
    valued = sorted(
        (s for s in states if s.is_complete and s.value is not None),
        key=lambda s: (s.value, -s.step),
    )
    assert not gone & {s.step for s in valued[:keep_best]}


@pytest.mark.parametrize(
    ("policy", "name", "rule"),
    [
        ({"keep_last": 0}, "--keep-last", "must be at least 1"),
        ({}, "--keep-last", "is required unless --superseded"),
        ({"keep_last": 1, "keep_best": -1}, "--keep-best", "must be 0 or more"),
        ({"keep_last": 1, "keep_best": 2}, "--metric", "is required with --keep-best"),
        ({"keep_last": 1, "metric": "loss"}, "--metric", "is only used with --keep-best"),
        ({"keep_last": 1, "keep_best": 1, "metric": ""}, "--metric", "must be loss or"),
        ({"keep_last": 1, "keep_best": 1, "metric": "l", "mode": "low"}, "--mode", "min or max"),
        ({"keep_last": 1, "keep_every": 0}, "--keep-every", "must be at least 1"),
        ({"superseded": True, "keep_best": 1, "metric": "l"}, "--keep-best", "needs --keep-last"),
    ],
)
def test_every_bad_policy_names_the_option_and_the_rule(
    policy: dict[str, Any], name: str, rule: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        RetentionPolicy(**policy)
    assert caught.value.name == name and rule in caught.value.rule


def test_objects_a_staying_row_needs_are_never_deleted() -> None:
    removed_rows = [
        ShardObject(1, "file:///c/step-1/a.pt"),
        ShardObject(1, "file:///c/last.ckpt"),
        ShardObject(2, "file:///c/step-2"),
        ShardObject(2, "file:///c/step-2"),
    ]
    staying = ["file:///c/last.ckpt", "file:///c/step-2/shard-9.pt"]
    assert objects_to_delete(removed_rows, staying) == {
        1: (ShardObject(1, "file:///c/step-1/a.pt"),),
        2: (),
    }
