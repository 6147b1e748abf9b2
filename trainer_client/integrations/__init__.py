"""Framework integrations: each module imports its framework lazily or at its own import only.

``trainer_client.restart.lookup`` (needs psycopg), ``trainer_client.integrations.lightning``
(needs the ``lightning`` extra). This package imports neither, so the base install stays light.
"""
