"""A reporter process finishing one checkpoint through the S3 upload step, slowly.

Run by tests/integrations/test_s3_upload.py as ``python -m tests.integrations.upload_child
JSON``; the test SIGKILLs it while the multipart upload is open (``max_bandwidth`` keeps the
upload going for seconds).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from trainer_client import CheckpointReporter
from trainer_client.finish.finish_job import PostStepCall
from trainer_client.storage.s3_finish import S3Upload
from trainer_client.storage.s3_upload import MIB, UploadSettings


def main(options: dict[str, Any]) -> None:
    upload = S3Upload(
        settings=UploadSettings(
            multipart_threshold=5 * MIB,
            part_size=5 * MIB,
            max_concurrency=1,
            max_bandwidth=options["bandwidth"],
        )
    )
    reporter = CheckpointReporter(
        options["queue_url"],
        job_id=options["job_id"],
        spool_dir=options["spool"],
        rank=0,
        world_size=1,
        endpoint_url=options["endpoint"],
        install_signal_handler=False,
        spot_poll=False,
        post_steps=[upload],
    )
    path = Path(options["file"])
    future = reporter.finish(
        [path],
        post=[PostStepCall("s3_upload", {"prefix": options["prefix"]})],
        step=options["step"],
        epoch=0,
        uri=path.as_uri(),
    )
    print("finishing", flush=True)
    print(future.result(timeout=120).status, flush=True)
    reporter.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
