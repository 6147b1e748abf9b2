"""Production operator tools against the real queues, database and checkpoint store.

One module per command (``*_command``, ``reconcile_cli``: its options and its run) beside its
logic: ``status``, ``checkpoints``, ``jobs``, ``restarts``, ``report``, ``prune``, ``reconcile``,
``replay-dlq``, ``migrate``, ``preflight``, ``spool``. Runs with the ``ops`` extra (boto3,
psycopg, rich); imports nothing of ``local`` or ``demo``.
"""
