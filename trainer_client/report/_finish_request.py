"""What ``finish()`` and a reporter's start hand the finisher: the files of a save, the post
steps by name, and the jobs an earlier process left unfinished."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpt_contract import CheckpointReport, FieldError, InvalidMessage, MessageTooLarge
from trainer_client.config import ReporterConfig
from trainer_client.exceptions import ReporterConfigError
from trainer_client.finish.finish_job import FileToFinish
from trainer_client.finish.finisher import Finisher
from trainer_client.finish.post_step import PostStep
from trainer_client.report._build import build_report
from trainer_client.storage.durable import FileIdentity


def registry(steps: Sequence[PostStep]) -> dict[str, PostStep]:
    """The post steps by name; each must be a PostStep and its name unique."""
    registry: dict[str, PostStep] = {}
    for step in steps:
        if not isinstance(step, PostStep) or not isinstance(getattr(step, "name", None), str):
            raise ReporterConfigError("post_steps", f"{step!r} is not a PostStep (name, run)")
        if step.name in registry:
            raise ReporterConfigError("post_steps", f"two steps are named {step.name!r}")
        registry[step.name] = step
    return registry


def files_to_finish(
    files: Sequence[str | os.PathLike[str]],
    base: str | os.PathLike[str] | None,
    staged: Mapping[str, str] | None,
) -> tuple[Path, tuple[FileToFinish, ...]]:
    """The save's base directory (default: the first file's) and its files as identified now
    (a staged file by its temporary path, renamed onto the final one once durable)."""
    paths = [Path(p).resolve() for p in files]
    if not paths:
        raise InvalidMessage([FieldError("files", "must name at least one file")])
    root = Path(base).resolve() if base is not None else paths[0].parent
    renames = {
        str(Path(k).resolve()): str(Path(v).resolve()) for k, v in dict(staged or {}).items()
    }
    to_finish = tuple(
        FileToFinish(
            name=os.path.relpath(p, root),
            path=str(p),
            identity=FileIdentity.of(renames.get(str(p), p)),
            staged=renames.get(str(p)),
        )
        for p in paths
    )
    return root, to_finish


def finished_report(
    cfg: ReporterConfig,
    fields: Mapping[str, Any],
    names: Sequence[str],
    *,
    list_files: bool,
    digests: Sequence[str] | None = None,
    run_attempt: int | None = None,
    world_size: int | None = None,
) -> tuple[CheckpointReport, str]:
    """A finished save's report and its encoded body, validated: with ``list_files`` the file
    names (and ``digests``) in ``extra``, or their count when they do not fit the contract's
    64 KiB body (thousands of shard files). The one place that decides the fallback: at
    ``finish()``'s call (the fields checked, no digests yet) and in the finisher (the report
    spooled as built here)."""
    extra = dict(fields.get("extra") or {})
    if list_files:
        listed = {**extra, "files": list(names)}
        if digests is not None:
            listed["file_sha256"] = dict(zip(names, digests, strict=True))
        try:
            return build_report(cfg, {**fields, "extra": listed}, run_attempt, world_size)
        except MessageTooLarge:
            extra["file_count"] = len(names)
    return build_report(cfg, {**fields, "extra": extra}, run_attempt, world_size)


def finish_fields(
    cfg: ReporterConfig,
    fields: Mapping[str, Any],
    to_finish: Sequence[FileToFinish],
    *,
    list_files: bool,
) -> tuple[CheckpointReport, dict[str, Any]]:
    """The report ``finish()`` validates at the call (its size measured now) and the fields, as
    the contract normalised them, that its job stores for the finisher to report with once the
    files are durable (without ``bytes``/``sha256`` and the file list, which it fills)."""
    size = sum(f.identity.size for f in to_finish)
    names = [f.name for f in to_finish]
    report, body = finished_report(cfg, {**fields, "bytes": size}, names, list_files=list_files)
    normalised = json.loads(body)
    stored = {
        k: normalised[k]
        for k in ("step", "epoch", "uri", "loss", "metrics", "objects")
        if k in normalised
    }
    # The caller's extras as the contract normalised them.
    stored["extra"] = {k: normalised[k] for k in (fields.get("extra") or {})}
    return report, stored


def recover_jobs(finisher: Finisher, log: logging.LoggerAdapter[logging.Logger]) -> None:
    """Queue the jobs an earlier process saved and did not finish; drop those whose files
    are gone or changed (the checkpoint was removed or overwritten since)."""
    jobs = finisher.store.load_all()
    for job in jobs:
        try:
            for f in job.files:
                if FileIdentity.of(f.current_path()) != f.identity:
                    raise FileNotFoundError(f"{f.name} changed")
        except FileNotFoundError as exc:
            finisher.drop_unsubmitted(job.seq)
            log.warning(
                "saved checkpoint of step %s not reported: its files are not intact (%s)",
                job.step,
                exc,
            )
            finisher.store.remove(job.seq)
            continue
        finisher.submit(job, recovered=True)
    if jobs:
        log.info("%s saved checkpoint(s) from an earlier start to finish", len(jobs))
