"""``ckpt-pipeline demo``: its options; the run is :func:`ckpt_pipeline.demo.run.main_demo`."""

from __future__ import annotations

import argparse
from typing import Any

from ckpt_pipeline.cli_args import positive_int
from ckpt_pipeline.settings import Settings


def add_parser(commands: Any) -> None:
    """Register ``demo`` on the CLI's subcommands."""
    demo = commands.add_parser("demo", help="the local end-to-end run (torch ranks, preemption)")
    demo.add_argument("--ranks", type=positive_int, default=8, help="torch ranks (default 8)")
    demo.add_argument("--epochs", type=positive_int, default=5, help="epochs (default 5)")
    demo.add_argument(
        "--no-preemption", dest="preemption", action="store_false", help="no simulated preemption"
    )
    demo.add_argument("--compare", action="store_true", help="the direct-write baseline beside")
    demo.add_argument(
        "--compare-ranks",
        type=positive_int,
        default=32,
        help="ranks in --compare (x pool 5 must exceed the 30-connection cap)",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """The demo (or the comparison)."""
    from ckpt_pipeline.demo.run import main_demo

    return main_demo(args)
