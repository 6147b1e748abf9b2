"""A loopback TCP relay: a network path that can be delayed or cut.

The fault tests cut a link to PostgreSQL or SQS with it (``stop()`` closes the port and every
relayed connection: a dead server or network path, not just a refused new connection); the
benchmarks delay one (``one_way_delay_s``: the round trip through RDS Proxy in a VPC that loopback
does not have).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import psycopg

from ckpt_pipeline.local.ports import free_loopback_port


class TcpRelay:
    """A loopback port forwarding to ``target``, each direction delayed by ``one_way_delay_s``."""

    def __init__(self, target: tuple[str, int], *, one_way_delay_s: float = 0.0) -> None:
        if not one_way_delay_s >= 0:
            raise ValueError(f"one_way_delay_s must be 0 or above, got {one_way_delay_s!r}")
        self.target = target
        self.one_way_delay_s = one_way_delay_s
        self.port = free_loopback_port()
        self._server: socket.socket | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.connections = 0

    @classmethod
    def to_postgres(cls, url: str, *, one_way_delay_s: float = 0.0) -> TcpRelay:
        """A relay to the server of the PostgreSQL ``url`` (default 127.0.0.1:5432)."""
        params = psycopg.conninfo.conninfo_to_dict(url)
        host, port = str(params.get("host") or "127.0.0.1"), int(str(params.get("port") or 5432))
        return cls((host, port), one_way_delay_s=one_way_delay_s)

    def url_for(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def postgres_url(self, url: str) -> str:
        """``url`` with its host and port replaced by this relay's."""
        return psycopg.conninfo.make_conninfo(url, host="127.0.0.1", port=str(self.port))

    def start(self) -> TcpRelay:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone leaves it listening.
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()
        with self._lock:
            open_now, self._open = self._open, set()
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> TcpRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                # A delayed relay must add its delay, not Nagle's wait for the next segment.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._server is not server:  # stopped meanwhile
                    client.close()
                    upstream.close()
                    return
                self._open.update((client, upstream))
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.one_way_delay_s:
                    time.sleep(self.one_way_delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(src)
