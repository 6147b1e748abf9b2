"""The ``ckpt-pipeline`` command and what it runs, split by who uses it.

* ``ops``   — production operator tools (status, DLQ replay); boto3, psycopg, rich.
* ``local`` — the local stand-in for AWS (SQS emulators, Lambda event source, throwaway PostgreSQL).
* ``demo``  — the demo job and the direct-write baseline.
* ``cli``   — the thin command line that dispatches to them, importing each lazily.
"""
