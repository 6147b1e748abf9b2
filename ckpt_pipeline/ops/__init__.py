"""Production operator tools: status and DLQ replay against the real queues and database.

Runs with the ``ops`` extra (boto3, psycopg, rich); imports nothing of ``local`` or ``demo``.
"""
