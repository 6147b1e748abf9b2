"""Finishing: a saved checkpoint made durable, hashed and post-processed off the training loop.

The finisher thread (``finisher``) takes each save's job (``finish_job``, written beside the
spool so a restart finishes it), fsyncs and hashes its files at the pace training leaves room
for (``_pacing``), runs its post-steps (``post_step``: an upload, say) and reports through the
callback the reporter gave it. It imports nothing of :mod:`trainer_client.report`.
"""
