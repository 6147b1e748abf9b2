"""The ``ckpt-pipeline`` command and what it runs, split by who uses it.

* ``ops``   — production operator tools (status, checkpoints, prune, reconcile, DLQ replay,
  migrate, preflight); boto3, psycopg, rich.
* ``local`` — the local stand-in for AWS (SQS emulators, Lambda event source and ``poll``,
  throwaway PostgreSQL).
* ``demo``  — the demo job and the direct-write baseline.
* ``cli``   — the parser and dispatch: one table of commands, each a module with ``add_parser``
  and ``run``; ``sdk_errors`` turns the SDKs' errors into one line and an exit code.
"""
