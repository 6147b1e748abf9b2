"""The reporter's settings: resolved once from arguments, torch.distributed and the environment."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict
from urllib.parse import urlparse

from ckpt_contract.message import JOB_ID_PATTERN, MAX_SQS_BATCH_ENTRIES, MAX_WORLD_SIZE
from trainer_client.exceptions import ReporterConfigError

PACK_RELAY_ENV = "CKPT_PACK_RELAY"

# How the finisher's threads yield to training (trainer_client/finish/_pacing.py applies it).
Priority = Literal["idle", "low", "normal"]
PRIORITIES: tuple[Priority, ...] = ("idle", "low", "normal")

DEFAULT_IMDS_ENDPOINT = "http://169.254.169.254"
JOB_ID_ENV_VARS = ("CKPT_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


@dataclass(frozen=True)
class Tuning:
    """Keyword-only knobs of the reporter, with defaults that fit torchrun and SQS."""

    max_spool_bytes: int = 256 * 1024 * 1024
    max_pending_records: int = 100_000
    batch_size: int = MAX_SQS_BATCH_ENTRIES
    compact_threshold_bytes: int = 1024 * 1024
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 5.0
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 10.0
    # torchrun sends SIGKILL 30 s after SIGTERM by default: flush in 20 s, leave slack to exit.
    close_timeout_s: float = 20.0
    signal_flush_timeout_s: float = 20.0
    install_signal_handler: bool = True
    spot_poll: bool | None = None
    spot_poll_interval_s: float = 5.0
    backlog_warning_interval_s: float = 30.0
    # Checkpoints saved and not yet finished (fsync, hash, post-steps, report): the next save
    # waits only beyond this many.
    max_finishing: int = 2
    # Threads hashing one checkpoint's files; None: the cores left idle since the previous
    # finish (/proc/stat), 1 to 8.
    hash_threads: int | None = None
    # How the finisher's threads yield to training (trainer_client/finish/_pacing.py): "low" adds
    # finisher_nice and takes the lowest best-effort I/O level, "idle" runs them SCHED_IDLE in
    # the idle I/O class, "normal" leaves them as they are.
    finisher_priority: str = "low"
    finisher_nice: int = 10
    # Write-back in slices of this many bytes (sync_file_range), then one fsync; 0: one fsync.
    writeback_slice_bytes: int = 32 * 1024 * 1024
    # Bytes per second the finisher writes back plus reads to hash; None: no cap.
    max_bandwidth: float | None = None
    # Before each slice and chunk, wait up to this long for a training step in flight to end
    # (the integrations' step hooks); 0: never wait.
    step_pause_s: float = 0.0
    # After a finish, give the files' clean pages back (posix_fadvise DONTNEED) so that a
    # checkpoint does not push the training data out of the page cache; the kernel's work of
    # freeing them runs in the finisher's thread then, not in a later reclaim.
    drop_page_cache: bool = True

    def validate(self) -> None:
        """Raise :class:`ReporterConfigError` naming the first knob that breaks its rule."""
        for name in (
            "max_spool_bytes",
            "max_pending_records",
            "compact_threshold_bytes",
            "max_finishing",
        ):
            if getattr(self, name) < 1:
                raise ReporterConfigError(name, "must be >= 1")
        self._validate_finisher()
        if not 1 <= self.batch_size <= MAX_SQS_BATCH_ENTRIES:
            raise ReporterConfigError(
                "batch_size", f"must be 1..{MAX_SQS_BATCH_ENTRIES} (SQS limit)"
            )
        for name in (
            "connect_timeout_s",
            "read_timeout_s",
            "backoff_base_s",
            "backoff_cap_s",
            "close_timeout_s",
            "signal_flush_timeout_s",
            "spot_poll_interval_s",
            "backlog_warning_interval_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ReporterConfigError(name, "must be a finite number of seconds > 0")
        if self.backoff_cap_s < self.backoff_base_s:
            raise ReporterConfigError("backoff_cap_s", "must be >= backoff_base_s")

    def _validate_finisher(self) -> None:
        if self.hash_threads is not None and not (
            _is_int(self.hash_threads) and 1 <= self.hash_threads <= 64
        ):
            raise ReporterConfigError("hash_threads", "must be an integer 1..64, or None (auto)")
        if self.finisher_priority not in PRIORITIES:
            raise ReporterConfigError(
                "finisher_priority", f"must be one of {', '.join(PRIORITIES)}"
            )
        if not (_is_int(self.finisher_nice) and 0 <= self.finisher_nice <= 19):
            raise ReporterConfigError("finisher_nice", "must be an integer 0..19")
        if not (_is_int(self.writeback_slice_bytes) and self.writeback_slice_bytes >= 0):
            raise ReporterConfigError(
                "writeback_slice_bytes", "must be an integer >= 0 (0: one fsync per file)"
            )
        cap = self.max_bandwidth
        if cap is not None and not (
            isinstance(cap, int | float)
            and not isinstance(cap, bool)
            and math.isfinite(cap)
            and cap >= 1024 * 1024
        ):
            raise ReporterConfigError(
                "max_bandwidth", "must be bytes per second >= 1048576 (1 MiB/s), or None"
            )
        pause = self.step_pause_s
        if not (
            isinstance(pause, int | float)
            and not isinstance(pause, bool)
            and math.isfinite(pause)
            and 0 <= pause <= 60
        ):
            raise ReporterConfigError("step_pause_s", "must be seconds 0..60 (0: never pause)")
        if not isinstance(self.drop_page_cache, bool):
            raise ReporterConfigError("drop_page_cache", "must be True or False")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class TuningKnobs(TypedDict, total=False):
    """The keyword arguments that build a :class:`Tuning` (so mypy checks ``**tuning``)."""

    max_spool_bytes: int
    max_pending_records: int
    batch_size: int
    compact_threshold_bytes: int
    connect_timeout_s: float
    read_timeout_s: float
    backoff_base_s: float
    backoff_cap_s: float
    close_timeout_s: float
    signal_flush_timeout_s: float
    install_signal_handler: bool
    spot_poll: bool | None
    spot_poll_interval_s: float
    backlog_warning_interval_s: float
    max_finishing: int
    hash_threads: int | None
    finisher_priority: str
    finisher_nice: int
    writeback_slice_bytes: int
    max_bandwidth: float | None
    step_pause_s: float
    drop_page_cache: bool


@dataclass(frozen=True)
class ReporterConfig:
    """Everything a reporter needs, validated; built by :func:`resolve_config`."""

    queue_url: str
    job_id: str
    spool_dir: Path
    rank: int
    world_size: int
    run_attempt: int
    endpoint_url: str | None
    region: str | None
    imds_endpoint: str
    spot_poll: bool
    tuning: Tuning
    # Set when the launch begins (trainer_client/report/launch.py), with run_attempt: the launcher's
    # count until then.
    launch_id: str | None = None
    # The node leader's pack relay (HOST:PORT, from CKPT_PACK_RELAY; None: send to SQS directly),
    # and whether this process serves it (LOCAL_RANK 0, the node's first rank).
    pack_relay: str | None = None
    serves_pack_relay: bool = False


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ReporterConfigError(name, f"must be an integer, got {raw!r}") from None


def _from_torch_distributed() -> tuple[int, int] | None:
    # Only look if the caller imported torch: an uninitialised torch has no process group, and the
    # client must work (and import fast) without torch.
    if sys.modules.get("torch") is None:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None


def _pick(name: str, env_name: str, sources: list[tuple[str, int | None]]) -> int:
    given = [(origin, value) for origin, value in sources if value is not None]
    if not given:
        raise ReporterConfigError(
            name,
            f"unknown: initialise torch.distributed, set {env_name} (as torchrun does) "
            f"or pass {name}=",
        )
    origin, value = given[0]
    for other_origin, other in given[1:]:
        if other != value:
            raise ReporterConfigError(
                name, f"{origin} says {value} but {other_origin} says {other}; make them agree"
            )
    return value


# torchrun's run id with --standalone, or on one node with its static default: a uuid4 drawn at
# every invocation (torch/distributed/run.py), so a relaunch would be a new job that finds nothing.
_RANDOM_RUN_ID = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
)


def _resolve_job_id(job_id: str | None, env: Mapping[str, str]) -> str:
    origin, value = "job_id", job_id
    passed_over: str | None = None
    if value is None:
        for var in JOB_ID_ENV_VARS:
            candidate = env.get(var)
            if not candidate:
                continue
            if var == "TORCHELASTIC_RUN_ID" and _RANDOM_RUN_ID.match(candidate):
                passed_over = candidate
                continue
            origin, value = var, candidate
            break
    if value is None and passed_over is not None:
        raise ReporterConfigError(
            "CKPT_JOB_ID",
            f"missing, and TORCHELASTIC_RUN_ID ({passed_over}) is torchrun's random id of this "
            "launch: a relaunch would be a new job that resumes from nothing. Set CKPT_JOB_ID "
            "(or pass job_id=) to a name that stays the same across launches",
        )
    if value is None:
        raise ReporterConfigError(
            "job_id", "missing: pass job_id= or set " + ", ".join(JOB_ID_ENV_VARS)
        )
    if origin == "TORCHELASTIC_RUN_ID" and value == "none":
        # torchrun's default --rdzv-id: every job would share one identity.
        raise ReporterConfigError(
            origin, "is torchrun's default 'none'; pass job_id=, set CKPT_JOB_ID or use --rdzv-id"
        )
    if not re.match(JOB_ID_PATTERN, value) or value in (".", ".."):
        raise ReporterConfigError(origin, "must be 1-128 chars of [A-Za-z0-9._:-], not '.' or '..'")
    return value


def _resolve_queue_url(queue_url: str | None, env: Mapping[str, str]) -> str:
    origin, value = (
        ("queue_url", queue_url) if queue_url else ("CKPT_QUEUE_URL", env.get("CKPT_QUEUE_URL"))
    )
    if not value:
        raise ReporterConfigError("queue_url", "missing: pass queue_url= or set CKPT_QUEUE_URL")
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ReporterConfigError(origin, f"must be an http(s) SQS queue URL, got {value!r}")
    if not parsed.path.endswith(".fifo"):
        raise ReporterConfigError(origin, "must name a FIFO queue (ending in .fifo)")
    return value


def _region_from_url(queue_url: str) -> str | None:
    # https://sqs.<region>.amazonaws.com/<account>/<name>
    match = re.match(r"^sqs\.([a-z0-9-]+)\.amazonaws\.com", urlparse(queue_url).netloc)
    return match.group(1) if match else None


def resolve_config(
    *,
    queue_url: str | None,
    job_id: str | None,
    spool_dir: str | os.PathLike[str] | None,
    rank: int | None,
    world_size: int | None,
    run_attempt: int | None,
    endpoint_url: str | None,
    region: str | None,
    tuning: Tuning,
    env: Mapping[str, str] | None = None,
) -> ReporterConfig:
    """Resolve every setting and validate it.

    ``rank`` and ``world_size`` have no precedence: every source that gives one (an initialised
    torch.distributed, ``RANK``/``WORLD_SIZE``, the argument) must give the same value, else a
    :class:`ReporterConfigError` names both. Every other setting is the argument when given, else
    its environment variable (``job_id``: ``CKPT_JOB_ID``, ``TORCHELASTIC_RUN_ID``,
    ``SLURM_JOB_ID`` in that order; ``region``: the argument, the queue URL's Region,
    ``AWS_REGION``, ``AWS_DEFAULT_REGION``).
    """
    env = os.environ if env is None else env
    tuning.validate()
    dist = _from_torch_distributed()
    rank_value = _pick(
        "rank",
        "RANK",
        [
            ("torch.distributed", dist[0] if dist else None),
            ("RANK", _env_int(env, "RANK")),
            ("rank=", rank),
        ],
    )
    world = _pick(
        "world_size",
        "WORLD_SIZE",
        [
            ("torch.distributed", dist[1] if dist else None),
            ("WORLD_SIZE", _env_int(env, "WORLD_SIZE")),
            ("world_size=", world_size),
        ],
    )
    if not 1 <= world <= MAX_WORLD_SIZE:
        raise ReporterConfigError("world_size", f"must be 1..{MAX_WORLD_SIZE}, got {world}")
    if not 0 <= rank_value < world:
        raise ReporterConfigError(
            "rank", f"must satisfy 0 <= rank < world_size ({world}), got {rank_value}"
        )
    attempt = (
        run_attempt if run_attempt is not None else _env_int(env, "TORCHELASTIC_RESTART_COUNT")
    )
    attempt = 0 if attempt is None else attempt
    if isinstance(attempt, bool) or attempt < 0:
        raise ReporterConfigError("run_attempt", f"must be an int >= 0, got {attempt!r}")
    spool = spool_dir if spool_dir is not None else env.get("CKPT_SPOOL_DIR")
    if not spool:
        raise ReporterConfigError(
            "spool_dir",
            "missing: pass spool_dir= or set CKPT_SPOOL_DIR (durable storage, e.g. EFS)",
        )
    url = _resolve_queue_url(queue_url, env)
    imds = env.get("CKPT_IMDS_ENDPOINT") or DEFAULT_IMDS_ENDPOINT
    spot = tuning.spot_poll
    if spot is None:
        spot = bool(env.get("CKPT_IMDS_ENDPOINT")) or running_on_ec2()
    return ReporterConfig(
        queue_url=url,
        job_id=_resolve_job_id(job_id, env),
        spool_dir=Path(spool),
        rank=rank_value,
        world_size=world,
        run_attempt=attempt,
        endpoint_url=endpoint_url,
        # boto3 reads AWS_DEFAULT_REGION only; AWS_REGION is what Lambda, EKS and the other SDKs
        # set, and what the CDK CLI reads first: the same order as the operator tools
        # (ckpt_pipeline/aws_region.py), after the explicit sources.
        region=region
        or _region_from_url(url)
        or env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or None,
        imds_endpoint=imds.rstrip("/"),
        spot_poll=spot,
        tuning=tuning,
        pack_relay=env.get(PACK_RELAY_ENV, "").strip() or None,
        serves_pack_relay=env.get("LOCAL_RANK", "0") == "0",
    )


def running_on_ec2() -> bool:
    """Whether this looks like an EC2 instance, from DMI/hypervisor files (no network call)."""
    for path, prefix in (
        ("/sys/devices/virtual/dmi/id/board_vendor", "Amazon EC2"),
        ("/sys/devices/virtual/dmi/id/sys_vendor", "Amazon EC2"),
        ("/sys/hypervisor/uuid", "ec2"),
    ):
        try:
            if Path(path).read_text().strip().startswith(prefix):
                return True
        except OSError:
            continue
    return False


# The restart's database URL when resume() is not given one: read by rank 0 only, which alone
# connects (one connection per job).
RESUME_DATABASE_URL_ENV = "CKPT_RESUME_DATABASE_URL"


def resume_database_url(given: str | None) -> str | None:
    """``given``, else ``CKPT_RESUME_DATABASE_URL``'s value (None when neither is set)."""
    return given or os.environ.get(RESUME_DATABASE_URL_ENV)


def torchrun_node() -> tuple[str | None, str | None]:
    """torchrun's ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` as set (the node's block of ranks);
    validated where they are used (``trainer_client.restart.node_fetch.NodeRanks.of``)."""
    return os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
