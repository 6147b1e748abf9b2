"""bench.restart_scale runs end to end, tiny: every node's share within the bound, and the model."""

from __future__ import annotations

import pytest

from bench import restart_scale


@pytest.mark.slow
def test_a_tiny_run_keeps_every_layout_within_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--nodes", "2", "--ranks-per-node", "2", "--dcp-mb", "2", "--hf-mb", "2"]
    assert restart_scale.main(argv) == 0
    out = capsys.readouterr().out
    for layout in ("dcp", "hf", "deepspeed"):
        assert f"## {layout}:" in out
    assert out.count("PASS") == 4 and "FAIL" not in out  # dcp with and without the relay
    assert "GETs per prefix: job/dcp/checkpoint-8: " in out
    # AND with the relay .metadata is one GET in the job, without it one per node
    assert "GETs of .metadata: 1;" in out and "GETs of .metadata: 2;" in out
    assert "model: 100,000 ranks = 12,500 nodes × 8" in out
    # AND the decision's time at 100,000 ranks, within the 10 s bound
    assert "decision model at 100,000 ranks" in out and "against the 10 s bound: within" in out


def test_the_model_counts_gets_against_s3s_rate_per_prefix() -> None:
    lines = restart_scale.model(ranks=16, per_node=8, checkpoint_tb=16 * 80e6 / 1e12, part_mb=8)
    # 2 nodes × 8 files of 80 MB in 10 parts of 8 MiB; rank 0's .metadata and 1 replicated range
    assert "in 80 GETs" in lines[1]
    assert "all nodes: 162 GETs (2 of them rank 0's" in lines[2]
    # the fewest spread prefixes that fit (16), 162 GETs over them: 10 on average
    assert lines[4].startswith("  spread_prefixes=16 ") and "(mean 10 = 0.00 s)" in lines[4]
    # the keys every node reads are one GET each, relayed: 1 hop, 13.2 MB in 1 MiB chunks
    assert "of them 1 on keys every node reads" in lines[4] or "of them 0 on" in lines[4]
    assert "down 1 hops in 1 MiB chunks" in lines[5]


def test_bad_options_are_refused_naming_the_option() -> None:
    with pytest.raises(SystemExit):
        restart_scale.main(["--nodes", "1"])
