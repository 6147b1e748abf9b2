"""What ``ckpt-pipeline --help`` and each command's ``--help`` show below the options.

The examples are the ones docs/operations.md (and README.md, docs/deploy.md) show, character for
character: tests/contract/test_docs.py checks that every line here appears in the docs and that
every command and option the docs name exists.
"""

from __future__ import annotations

import argparse

# Where each command is explained (paths from the repository root).
DOCS = {
    "demo": "README.md",
    "migrate": "docs/operations.md",
    "status": "docs/operations.md#status-is-my-job-recorded",
    "replay-dlq": "docs/operations.md#replaying-the-dlq",
    "local": "README.md#quick-start",
    "poll": "docs/operations.md#the-local-event-source-poll",
    "preflight": "docs/deploy.md#prerequisites",
    "reconcile": "docs/operations.md#reconciling-the-database-with-the-checkpoint-store",
    "checkpoints": "docs/operations.md#pruning-old-checkpoints",
    "jobs": "docs/operations.md#who-owns-a-job",
    "prune": "docs/operations.md#pruning-old-checkpoints",
    "spool": "docs/operations.md#reports-left-in-a-spool",
}

EXAMPLES = {
    "demo": (
        "ckpt-pipeline demo",
        "ckpt-pipeline demo --compare",
        "ckpt-pipeline demo --ranks 4 --epochs 3 --no-preemption",
    ),
    "migrate": ("DATABASE_URL=postgresql://postgres@127.0.0.1:5432/ckpt ckpt-pipeline migrate",),
    "status": (
        "ckpt-pipeline status --job run3",
        "ckpt-pipeline status --json",
    ),
    "replay-dlq": (
        "ckpt-pipeline replay-dlq --dry-run",
        "ckpt-pipeline replay-dlq --reason 'exhausted retries'",
        "ckpt-pipeline replay-dlq --job run3 --reason InvalidMessage",
        "ckpt-pipeline replay-dlq --job run3 --reason UnknownSchema --discard 'client 0.1 bug'",
    ),
    "local": ("ckpt-pipeline local --bucket ckpt --env-file .ckpt-local.env",),
    "poll": ('ckpt-pipeline poll --queue-url "$CKPT_QUEUE_URL" --concurrency 2 --once',),
    "reconcile": (
        "ckpt-pipeline reconcile --job run3 --store s3://ml-checkpoints/run3",
        "ckpt-pipeline reconcile --job run3 --store s3://ml-checkpoints/run3 --backfill",
    ),
    "checkpoints": ("ckpt-pipeline checkpoints --job run3 --best loss",),
    "jobs": (
        "ckpt-pipeline jobs --prefix team-a-",
        "ckpt-pipeline jobs transfer run3 --to AROAEXAMPLEROLEID --reason 'moved to role train-b'",
        "ckpt-pipeline jobs release run3 --reason 'relaunched under the new account role'",
    ),
    "prune": (
        "ckpt-pipeline prune --job run3 --keep-last 3 --keep-best 2 --metric loss",
        "ckpt-pipeline prune --job run3 --keep-last 3 --keep-best 2 --metric loss --apply",
        "ckpt-pipeline prune --all --superseded --apply",
    ),
    "spool": ('ckpt-pipeline spool send --dir /mnt/efs/ckpt-spool --queue-url "$CKPT_QUEUE_URL"',),
    "preflight": (
        "ckpt-pipeline preflight",
        "ckpt-pipeline preflight -c createDatabase=false -c vpcId=vpc-0123456789abcdef0",
    ),
}

TOP_EXAMPLES = (
    "ckpt-pipeline demo",
    "ckpt-pipeline status --job run3",
    "ckpt-pipeline replay-dlq --dry-run",
)


def _epilog(examples: tuple[str, ...], docs: str | None) -> str:
    text = "examples:\n" + "".join(f"  {line}\n" for line in examples)
    return text + (f"\ndocs: {docs}\n" if docs else "")


def add_examples(
    parser: argparse.ArgumentParser,
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Append the examples and the docs' place to the top-level and each command's help.

    A command without a description gets its one-line help as one, so that ``COMMAND --help``
    opens with the line ``ckpt-pipeline --help`` lists. A command's own epilog (``poll``'s
    environment) stays and the examples follow it; a command without examples here keeps its
    help as it is.
    """
    summaries = {action.dest: action.help for action in commands._choices_actions}
    parser.epilog = (
        _epilog(TOP_EXAMPLES, None)
        + "  ckpt-pipeline COMMAND --help\n\n"
        + "docs: docs/operations.md (the runbook), docs/deploy.md, README.md\n"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for name, sub in commands.choices.items():
        if name not in EXAMPLES:
            continue
        sub.description = sub.description or summaries.get(name)
        own = f"{sub.epilog.rstrip()}\n\n" if sub.epilog else ""
        sub.epilog = own + _epilog(EXAMPLES[name], DOCS.get(name))
        sub.formatter_class = argparse.RawDescriptionHelpFormatter
