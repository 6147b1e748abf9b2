"""ckpt-pipeline: run the checkpoint pipeline locally, migrate, inspect, prune, replay the DLQ.

Environment: DATABASE_URL (every command that reads or writes the database: migrate, status,
checkpoints, jobs, restarts, report, prune, reconcile, local, poll, replay-dlq --discard),
CKPT_QUEUE_URL and DLQ_URL
(defaults for the queue options); boto3's usual configuration (AWS_REGION, AWS_ENDPOINT_URL,
credentials) for SQS and S3.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, Protocol, cast

from ckpt_pipeline.cli_help import add_examples
from ckpt_pipeline.exceptions import ConfigError, PipelineError
from ckpt_pipeline.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED
from ckpt_pipeline.sdk_errors import ServiceError, explain
from ckpt_pipeline.settings import Settings
from lambda_writer import PolicyError

# Every command: its name, the module that registers and runs it, and the distribution extra
# it needs (pyproject.toml). Each module has ``add_parser(commands)`` and ``run(args, settings)``
# and imports nothing heavy at module level: building the parser imports them all.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("demo", "ckpt_pipeline.demo.command", "demo"),
    ("migrate", "ckpt_pipeline.ops.migrate_command", "ops"),
    ("status", "ckpt_pipeline.ops.status_command", "ops"),
    ("replay-dlq", "ckpt_pipeline.ops.replay_command", "ops"),
    ("local", "ckpt_pipeline.local.local_command", "local"),
    ("poll", "ckpt_pipeline.local.poll_command", "local"),
    ("preflight", "ckpt_pipeline.ops.preflight_command", "ops"),
    ("reconcile", "ckpt_pipeline.ops.reconcile_cli", "ops"),
    ("checkpoints", "ckpt_pipeline.ops.checkpoints_command", "ops"),
    ("jobs", "ckpt_pipeline.ops.jobs_command", "ops"),
    ("restarts", "ckpt_pipeline.ops.restarts_command", "ops"),
    ("report", "ckpt_pipeline.ops.report_command", "ops,plot"),
    ("prune", "ckpt_pipeline.ops.prune_command", "ops"),
    ("spool", "ckpt_pipeline.ops.spool_command", "ops"),
)

_EXIT_CODES = """exit status:
  0    done
  1    a service (S3, SQS, PostgreSQL) failed or refused, or the command found
       something to act on (reconcile, status --job, replay-dlq)
  2    an option or setting was refused; nothing was changed
  130  interrupted (Ctrl-C)
"""


class _Command(Protocol):
    def add_parser(self, commands: Any) -> None:
        """Register the command's subparser."""

    def run(self, args: argparse.Namespace, settings: Settings) -> int:
        """Run it; returns the exit code."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a refused argument said in one line (argparse prints the usage too).

    The subcommands' parsers are of this class too (``add_subparsers`` passes it on)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _module(name: str) -> _Command:
    module_name = next(module for command, module, _ in COMMANDS if command == name)
    module: _Command = importlib.import_module(module_name)  # type: ignore[assignment]
    return module


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = _Parser(prog="ckpt-pipeline", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="errors only")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"),
    )
    for name, _, _ in COMMANDS:
        _module(name).add_parser(commands)
    for sub in commands.choices.values():
        # Also after the subcommand (`ckpt-pipeline poll -q`); SUPPRESS keeps a top-level -q.
        sub.add_argument(
            "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="errors only"
        )
    add_examples(parser, commands)
    parser.epilog = f"{parser.epilog or ''}\n{_EXIT_CODES}"
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ckpt-pipeline")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    if not quiet and verbose == 0:
        level = logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _extra(command: str) -> str:
    return next((extra for name, _, extra in COMMANDS if name == command), "ops")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one subcommand with ``env`` (default ``os.environ``); returns the exit code.

    Whatever fails is said in one line on stderr, ``ckpt-pipeline COMMAND: …``, naming the
    setting and the service; the exit code is the one ``--help`` states.
    """
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose, args.quiet)
    prefix = f"ckpt-pipeline {args.command}:"
    try:
        return _module(args.command).run(args, Settings.from_env(env))
    except (ConfigError, PolicyError) as exc:
        # PolicyError: a retention option (retention's rules, shared with the CDK context).
        print(f"{prefix} {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ServiceError as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return exc.exit_code
    except PipelineError as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as exc:
        # Each command needs its role's extra; a base (trainer-only) install has none of them.
        extra = _extra(args.command)
        print(
            f"{prefix} needs the '{extra}' extra"
            f" (pip install 'ckpt-pipeline[{extra}]'): module {exc.name!r} is not installed",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    except Exception as exc:
        # An SDK error no command wrapped: the service from the failed operation where it can.
        explained = explain(exc)
        if explained is None:
            raise
        print(f"{prefix} {explained}", file=sys.stderr)
        return explained.exit_code


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
