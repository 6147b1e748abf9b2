"""Reporting: a report validated, spooled durably and sent to SQS (the write path).

``CheckpointReporter`` (:mod:`.reporter`) builds and spools each report (``_build``,
``_fields``, ``spool``, ``_framing``), its sender thread sends them (``sender``, ``_sqs_client``,
``_retry``, ``_gate``, ``_wake``; through a node's leader with ``pack_relay``), and numbers the
launch it reports as (``launch``). The reporter's lifecycle lives here too (``signals``: flush on
SIGTERM, ``spot``: flush on a Spot notice, ``_shutdown``: ``close()``): each exists to get the
spool sent before the process goes. It hands saves to the finisher (:mod:`trainer_client.finish`);
the finisher never calls back up into this package but through the callback it is given.
"""
