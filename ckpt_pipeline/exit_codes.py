"""The CLI's exit codes, one home for the numbers every command returns.

``ckpt-pipeline --help`` states them (``cli._EXIT_CODES``). A command whose 1 means something of
its own names it in its own module (``reconcile``'s ``EXIT_FOUND``, ``checkpoints``'
``EXIT_NO_BEST``).
"""

from __future__ import annotations

EXIT_OK = 0
# A service (S3, SQS, PostgreSQL) answered with an error or could not be reached.
EXIT_FAILED = 1
# The command ran and found something left to act on (status --job, replay-dlq).
EXIT_INCOMPLETE = 1
# A setting or option was refused before any service was asked; nothing was changed.
EXIT_CONFIG = 2
# 128 + SIGINT, as a shell reports a Ctrl-C'd command.
EXIT_INTERRUPTED = 130
