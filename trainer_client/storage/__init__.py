"""Where a checkpoint's bytes live and whether they are still as written.

One room for storage: the checkpoint URI (``uri``), durable local files (``durable``), the S3
upload and its pins (``s3_upload``, ``s3_pins``, the finisher's post-step ``s3_finish``), DCP to
S3 (``dcp_s3``), verification (``verify``, its pure rules in ``verify_rules``) and the restore
(``restore``, its download in ``restore_fetch``). The framework integrations call into it; it
never imports them (``tests/contract/test_boundaries.py``).
"""
