"""EC2 Spot interruption notice from IMDSv2, polled on a daemon thread."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)
# IMDSv2 session token, then the instance-action document: 404 until an interruption is
# scheduled (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
TOKEN_PATH = "/latest/api/token"
ACTION_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_S = 21600
_HTTP_TIMEOUT_S = 1.0


class SpotPoller(threading.Thread):
    """Polls ``spot/instance-action``; on a notice, calls ``on_notice(document)`` once."""

    def __init__(
        self,
        endpoint: str,
        interval_s: float,
        on_notice: Callable[[dict[str, Any]], None],
        log: logging.LoggerAdapter[logging.Logger] | None = None,
    ) -> None:
        super().__init__(name="ckpt-spot-poller", daemon=True)
        self._endpoint, self._interval, self._on_notice = endpoint, interval_s, on_notice
        self._log = log or logging.LoggerAdapter(_log, {})
        self._stop = threading.Event()
        self._token: str | None = None
        self._token_expires = 0.0
        self.notice: dict[str, Any] | None = None

    def stop(self) -> None:
        """Ask the thread to end (it is a daemon: never waited for long)."""
        self._stop.set()

    def run(self) -> None:
        """Poll until stopped or a notice arrives."""
        while not self._stop.is_set():
            try:
                notice = self.poll_once()
            except (OSError, ValueError) as exc:
                self._log.debug("IMDS poll failed: %s", exc)
                self._token = None
                notice = None
            if notice is not None:
                self.notice = notice
                self._log.warning("EC2 Spot interruption notice %s: flushing reports now", notice)
                self._on_notice(notice)
                return
            self._stop.wait(self._interval)

    def _session_token(self) -> str:
        if self._token is None or time.monotonic() >= self._token_expires:
            request = urllib.request.Request(
                self._endpoint + TOKEN_PATH,
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:
                self._token = response.read().decode().strip()
            self._token_expires = time.monotonic() + TOKEN_TTL_S - 60
        return self._token

    def poll_once(self) -> dict[str, Any] | None:
        """One check: the instance-action document, or None while nothing is scheduled."""
        request = urllib.request.Request(
            self._endpoint + ACTION_PATH,
            headers={"X-aws-ec2-metadata-token": self._session_token()},
        )
        try:
            with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:
                document = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code == 401:
                self._token = None  # expired token: fetch a new one next time
            raise
        if isinstance(document, dict) and document.get("action"):
            return document
        return None
