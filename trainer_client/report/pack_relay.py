"""Reports packed per node: a node leader's relay packs its ranks' reports into ``ckpt.pack.v1``
messages; every rank's sender talks to it as it talks to SQS, and falls back to SQS when it dies.

Why and what it costs: docs/DESIGN.md, "The intake at 100,000 ranks: reports packed per node".

* :class:`PackRelay` takes ``SendMessageBatch`` entries (each an encoded ``ckpt.v1`` report with
  its group and deduplication id, as the sender builds them), waits ``linger_s`` for the node's
  other ranks, packs up to ``max_reports`` per message, sends up to 10 packs per
  ``SendMessageBatch``, and answers each entry with SQS's own verdict on the pack that held it: a
  rank acks its spool only once SQS took its report.
* :class:`PackRelayServer` serves a relay over TCP (one JSON line per call, one per answer) to the
  node's rank processes; :class:`PackClient` is their SQS client: ``send_message_batch`` goes to
  the relay, or to SQS directly for ``retry_after_s`` once the relay refused, timed out or hung
  up (a dead leader). :class:`LocalPackClient` serves ranks that share the leader's process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ckpt_contract.pack import (
    MAX_PACK_BYTES,
    MAX_PACK_REPORTS,
    encode_pack,
    pack_dedup_id,
    pack_size,
)
from trainer_client.exceptions import RelayUnavailable

_log = logging.getLogger(__name__)

# SendMessageBatch carries at most 10 entries, each message and the whole call within the message
# size limit (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
SQS_BATCH_ENTRIES = 10
SQS_BATCH_BYTES = 1024 * 1024
# At most this many reports per pack: a leader serving two nodes of 8 ranks (what meets 15 s at
# 100,000 ranks in `python -m bench intake_model`; a leader per node packs its 8 all the same,
# after the linger). 16 reports of the contract's largest body (64 KiB) would pass the pack's
# 256 KiB: _packs splits by size first, so a pack is never refused for its size.
DEFAULT_MAX_REPORTS = 16
DEFAULT_LINGER_S = 0.02
DEFAULT_TIMEOUT_S = 10.0  # a rank's wait for the relay's answer before it sends on its own
DEFAULT_RETRY_AFTER_S = 30.0
Response = dict[str, list[dict[str, Any]]]


class _Entry:
    __slots__ = ("entry", "future", "size")

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry
        self.size = len(str(entry["MessageBody"]).encode())
        self.future: Future[dict[str, Any]] = Future()


class PackRelay:
    """Packs the entries handed to :meth:`send_message_batch` and sends them to one queue."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        *,
        max_reports: int = DEFAULT_MAX_REPORTS,
        linger_s: float = DEFAULT_LINGER_S,
        senders: int = 4,
    ) -> None:
        if not 1 <= max_reports <= MAX_PACK_REPORTS:
            raise ValueError(f"max_reports: must be 1..{MAX_PACK_REPORTS}, got {max_reports}")
        if not 0 <= linger_s <= 5:
            raise ValueError(f"linger_s: must be 0..5 s, got {linger_s}")
        self._sqs, self.queue_url = sqs, queue_url
        self.max_reports, self.linger_s = max_reports, linger_s
        self._pending: list[_Entry] = []
        self._cond = threading.Condition()
        self._closed = False
        self._pool = ThreadPoolExecutor(senders, thread_name_prefix="ckpt-pack-send")
        self.packs_sent = 0
        self.reports_sent = 0
        self._thread = threading.Thread(target=self._run, name="ckpt-pack-relay", daemon=True)
        self._thread.start()

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[dict[str, Any]]) -> Response:  # noqa: N803
        """SQS's ``SendMessageBatch``, answered once the packs holding ``Entries`` were sent."""
        if QueueUrl != self.queue_url:
            raise ValueError(f"QueueUrl: this relay sends to {self.queue_url}, not {QueueUrl}")
        out: Response = {"Successful": [], "Failed": []}
        for future in self.submit(Entries):
            verdict = future.result()  # a transport error raises here, as boto3 would
            out["Failed" if "Code" in verdict else "Successful"].append(verdict)
        return out

    def submit(self, entries: Sequence[dict[str, Any]]) -> list[Future[dict[str, Any]]]:
        """Queue ``entries`` for packing without waiting: per entry, a future of SQS's verdict
        on its pack (``{"Id"}``, with ``Code`` and ``Message`` when it failed)."""
        items = [_Entry(e) for e in entries]
        with self._cond:
            if self._closed:
                raise ConnectionError("the pack relay is closed")
            self._pending.extend(items)
            self._cond.notify()
        return [item.future for item in items]

    def close(self) -> None:
        """Send what is pending, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._pool.shutdown(wait=True)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                # The node's other ranks report within a few ms of the first: wait for them,
                # unless a whole pack is here already.
                deadline = time.monotonic() + self.linger_s
                while len(self._pending) < self.max_reports and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                taken, self._pending = self._pending, []
            for call in self._calls(self._packs(taken)):
                self._pool.submit(self._send, call)

    def _packs(self, items: list[_Entry]) -> list[list[_Entry]]:
        packs: list[list[_Entry]] = []
        current: list[_Entry] = []
        used = 0
        for item in items:
            grown = pack_size(used + item.size, len(current) + 1)
            if current and (len(current) >= self.max_reports or grown > MAX_PACK_BYTES):
                packs.append(current)
                current, used = [], 0
            current.append(item)
            used += item.size
        if current:
            packs.append(current)
        return packs

    @staticmethod
    def _calls(packs: list[list[_Entry]]) -> list[list[list[_Entry]]]:
        calls: list[list[list[_Entry]]] = []
        current: list[list[_Entry]] = []
        used = 0
        for pack in packs:
            size = pack_size(sum(i.size for i in pack), len(pack))
            if current and (len(current) >= SQS_BATCH_ENTRIES or used + size > SQS_BATCH_BYTES):
                calls.append(current)
                current, used = [], 0
            current.append(pack)
            used += size
        if current:
            calls.append(current)
        return calls

    def _send(self, packs: list[list[_Entry]]) -> None:
        entries = []
        for n, pack in enumerate(packs):
            dedup = pack_dedup_id([str(i.entry.get("MessageDeduplicationId", "")) for i in pack])
            entry: dict[str, Any] = {
                "Id": str(n),
                "MessageBody": encode_pack([str(i.entry["MessageBody"]) for i in pack]),
            }
            if any("MessageGroupId" in i.entry for i in pack):
                # FIFO: each pack its own group (the writer does not rely on order), so that the
                # event source may hand packs to both writers at once.
                entry |= {"MessageGroupId": dedup[:128], "MessageDeduplicationId": dedup}
            entries.append(entry)
        try:
            result = self._sqs.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
        except BaseException as exc:  # every rank of these packs sees the call's error
            for pack in packs:
                for item in pack:
                    item.future.set_exception(exc)
            return
        failed = {f["Id"]: f for f in result.get("Failed", [])}
        for n, pack in enumerate(packs):
            verdict = failed.get(str(n))
            if verdict is None:
                self.packs_sent += 1
                self.reports_sent += len(pack)
            for item in pack:
                answer = {"Id": item.entry["Id"]}
                if verdict is not None:
                    answer |= {
                        k: verdict[k] for k in ("Code", "Message", "SenderFault") if k in verdict
                    }
                item.future.set_result(answer)


class LocalPackClient:
    """The SQS client of ranks that share the leader's process: calls the relay directly."""

    def __init__(self, relay: PackRelay) -> None:
        self._relay = relay

    def send_message_batch(self, **kwargs: Any) -> Response:
        """SQS's ``SendMessageBatch`` through the relay."""
        return self._relay.send_message_batch(**kwargs)


class _Handler(socketserver.StreamRequestHandler):
    server: PackRelayServer

    def handle(self) -> None:
        for line in self.rfile:
            request = json.loads(line)
            try:
                answer: dict[str, Any] = self.server.relay.send_message_batch(**request)
            except Exception as exc:  # the rank retries as after any failed call
                answer = {"Error": f"{type(exc).__name__}: {exc}"}
            self.wfile.write(json.dumps(answer).encode() + b"\n")


class PackRelayServer(socketserver.ThreadingTCPServer):
    """The node leader's relay over TCP: ``(host, port)``; port 0 picks a free one."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, relay: PackRelay, address: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        super().__init__(address, _Handler)
        self.relay = relay
        self._thread = threading.Thread(
            target=self.serve_forever, name="ckpt-pack-server", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> str:
        """``HOST:PORT``, what the node's ranks set ``CKPT_PACK_RELAY`` to."""
        host, port = self.server_address[:2]
        return f"{host!s}:{port}" if isinstance(host, str) else f"{host.decode()}:{port}"

    def close(self) -> None:
        """Stop serving (connected ranks see their connection close), then close the relay."""
        self.shutdown()
        self.server_close()
        self.relay.close()


class PackClient:
    """A rank's SQS client when its node has a leader: the relay first, SQS when it is gone."""

    def __init__(
        self,
        address: str,
        fallback: Any,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
    ) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"pack relay address: expected HOST:PORT, got {address!r}")
        self._address = (host, int(port))
        self._fallback = fallback
        self._timeout_s, self._retry_after_s = timeout_s, retry_after_s
        self._local = threading.local()
        self._down_until = 0.0
        self.fallbacks = 0

    def send_message_batch(self, **kwargs: Any) -> Response:
        """SQS's ``SendMessageBatch`` through the relay, or straight to SQS without one."""
        if time.monotonic() >= self._down_until:
            try:
                return self._via_relay(kwargs)
            except (OSError, ValueError) as exc:
                self._drop()
                self._down_until = time.monotonic() + self._retry_after_s
                _log.warning(
                    "pack relay %s:%s unavailable (%s); sending to SQS directly for %.0f s",
                    *self._address, exc, self._retry_after_s,
                )  # fmt: skip
        self.fallbacks += 1
        result: Response = self._fallback.send_message_batch(**kwargs)
        return result

    def _via_relay(self, request: dict[str, Any]) -> Response:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            sock = socket.create_connection(self._address, timeout=self._timeout_s)
            stream = self._local.stream = sock.makefile("rwb")
            self._local.sock = sock
        stream.write(json.dumps(request).encode() + b"\n")
        stream.flush()
        line = stream.readline()
        if not line:
            raise RelayUnavailable("the relay closed the connection")
        answer: dict[str, Any] = json.loads(line)
        if "Error" in answer:
            raise RelayUnavailable(str(answer["Error"]))
        return answer

    def _drop(self) -> None:
        sock = getattr(self._local, "sock", None)
        self._local.stream = self._local.sock = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
