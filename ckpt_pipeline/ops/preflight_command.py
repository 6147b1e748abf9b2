"""``ckpt-pipeline preflight``: its options; the checks are in ``preflight(_aws)``."""

from __future__ import annotations

import argparse
from typing import Any

from ckpt_pipeline.settings import Settings


def add_parser(commands: Any) -> None:
    """Register ``preflight`` on the CLI's subcommands."""
    preflight = commands.add_parser(
        "preflight",
        help="would cdk deploy fail here? concurrency, quotas, bootstrap, the resources named",
    )
    preflight.add_argument("--cdk-json", default="cdk.json", help="context file (default cdk.json)")
    preflight.add_argument(
        "-c", "--context", action="append", metavar="KEY=VALUE", help="context override, as cdk"
    )
    preflight.add_argument(
        "--allow-unchecked",
        action="store_true",
        help="exit 0 although some questions could not be checked (no Describe* permission)",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    """One line per finding; exit 1 when the deploy would fail."""
    from ckpt_pipeline.ops.preflight_aws import main_preflight

    return main_preflight(args)
