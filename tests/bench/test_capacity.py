"""bench.capacity's drains on the real server: every layout and client leaves the rows it must,
and the CPU it reports is CPU that was spent (a tiny checkpoint: not a measurement)."""

from __future__ import annotations

import pytest

from bench import capacity
from bench._cpu import machine_cpu_s
from bench._drains import check_prebuilt_matches_repository
from tests.conftest import ADMIN_URL


def test_prebuilt_client_restates_the_repository_statement() -> None:
    # GIVEN the repository's write_batch WHEN the bench checks its prebuilt client THEN it agrees
    check_prebuilt_matches_repository()


@pytest.mark.slow
def test_every_layout_and_client_writes_the_checkpoint() -> None:
    # GIVEN a checkpoint of 60 ranks (6 batches) on the current schema and 0005's
    drains = capacity.measure_all(ADMIN_URL, [60], ["slots", "delta"], 1, ["live", "prebuilt"])
    # THEN each (schema, client) has its three drains, each verified by measure_drain itself
    assert set(drains) == {(s, 60, c) for s in ("slots", "delta") for c in ("live", "prebuilt")}
    for case in drains.values():
        assert (case.one.writers, case.shared.writers, case.disjoint.writers) == (1, 2, 2)
        assert len(case.one.batch_ms) == len(case.shared.batch_ms) == 6
        assert len(case.paired) == 1
        assert case.relative == case.disjoint.seconds / case.shared.seconds
        for d in (case.one, case.shared, case.disjoint):
            assert d.client_cpu_s > 0 and d.backend_cpu_s > 0
            assert d.machine_busy_s >= 0 and d.machine_steal_s >= 0
    # AND the verdicts print for both clients
    assert capacity.verdicts(drains, "slots", "prebuilt") in (True, False)


def test_machine_cpu_counters_only_grow() -> None:
    busy0, steal0 = machine_cpu_s()
    sum(i * i for i in range(300_000))
    busy1, steal1 = machine_cpu_s()
    assert busy1 >= busy0 and steal1 >= steal0


@pytest.mark.slow
def test_a_simulated_round_trip_is_paid_by_every_batch_of_every_layout() -> None:
    # GIVEN a checkpoint of 30 ranks (3 batches) WHEN drained with a 2 ms simulated round trip
    drains = capacity.measure_all(ADMIN_URL, [30], ["slots"], 1, ["live"], rtt_ms=2.0)
    # THEN every batch of every layout took at least the round trip (a sleep never ends early),
    # and each drain still left its rows (measure_drain checks them)
    case = drains[("slots", 30, "live")]
    for d in (case.one, case.shared, case.disjoint):
        assert len(d.batch_ms) == 3 and min(d.batch_ms) >= 2.0
