"""The reporter's own SQS client: boto3's, with our timeouts and no retries of its own; through
the node leader's pack relay when ``CKPT_PACK_RELAY`` (``HOST:PORT``) is set."""

from __future__ import annotations

import logging
import threading
from typing import Any

from trainer_client.config import ReporterConfig
from trainer_client.exceptions import ReporterConfigError

_leader_lock = threading.Lock()
_leader: Any = None  # this process's PackRelayServer, when it is its node's leader


def build_sqs_client(config: ReporterConfig) -> Any:
    """An SQS client for ``config``: through the node's pack relay when ``CKPT_PACK_RELAY`` names
    one (the node's first rank, ``LOCAL_RANK`` 0, serves it), else SQS's own."""
    sqs = _boto_client(config)
    address = config.pack_relay
    if address is None:
        return sqs
    from trainer_client.report.pack_relay import PackClient

    if config.serves_pack_relay:
        _serve_relay(address, sqs, config.queue_url)
    return PackClient(address, sqs)


def _serve_relay(address: str, sqs: Any, queue_url: str) -> None:
    """Start this process's relay once (its ranks' reporters share it). A relay that cannot bind
    is not fatal: the address may be another node's leader (one relay serving two nodes), which
    this node's ranks then use; if nobody serves it, their clients fall back to SQS."""
    global _leader
    from trainer_client.report.pack_relay import PackRelay, PackRelayServer

    with _leader_lock:
        if _leader is not None:
            return
        host, _, port = address.rpartition(":")
        relay = PackRelay(sqs, queue_url)
        try:
            _leader = PackRelayServer(relay, (host, int(port)))
        except (OSError, ValueError) as exc:
            relay.close()
            logging.getLogger(__name__).warning(
                "pack relay %s not started in this process (%s): this node's ranks use the relay"
                " at that address if another node's leader serves it, else send to SQS themselves",
                address,
                exc,
            )


def _boto_client(config: ReporterConfig) -> Any:
    """SQS's own client for ``config`` (region, endpoint, timeouts); the sender owns retries."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import NoRegionError

    t = config.tuning
    botocore_config = Config(
        connect_timeout=t.connect_timeout_s,
        read_timeout=t.read_timeout_s,
        # One attempt per call: our sender owns retries and backoff, so deadlines hold.
        retries={"total_max_attempts": 1, "mode": "standard"},
        # The sender builds every entry itself from validated reports; botocore's client-side
        # walk of the request shape was CPU the sender held the GIL for on every call (SQS
        # still validates the request server-side).
        parameter_validation=False,
    )
    try:
        return boto3.session.Session().client(
            "sqs",
            region_name=config.region,
            endpoint_url=config.endpoint_url,
            config=botocore_config,
        )
    except NoRegionError:
        raise ReporterConfigError(
            "region",
            "no AWS region: set AWS_DEFAULT_REGION (or AWS_REGION) or pass region= (or use an"
            " sqs.<region> queue URL)",
        ) from None
