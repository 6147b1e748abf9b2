"""``ckpt-pipeline migrate``: apply the pending schema migrations to DATABASE_URL."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ckpt_pipeline.exit_codes import EXIT_FAILED, EXIT_OK
from ckpt_pipeline.settings import Settings


def add_parser(commands: Any) -> None:
    """Register ``migrate`` on the CLI's subcommands."""
    commands.add_parser("migrate", help="apply pending schema migrations to DATABASE_URL")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Apply what is pending (one transaction); print what was applied."""
    from lambda_writer import MigrationError, apply_migrations, connect_url

    url = settings.require_database_url()
    try:
        with connect_url(url) as conn:
            applied = apply_migrations(conn)
    except MigrationError as exc:
        # Names the migration and what the role lacks (CREATE on public, CREATEROLE); nothing
        # of the run is applied (one transaction).
        print(f"ckpt-pipeline migrate: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return EXIT_OK
