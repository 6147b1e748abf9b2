"""A loopback TCP relay whose stop() also cuts the connections already relayed: a dead server or
network path, not just a refused new connection. Shared by the writer and end-to-end fault tests."""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpRelay:
    """A loopback port forwarding to ``target``; stop() closes the port AND every relayed
    connection (a dead server or network path, not just a refused new connection)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self._server: socket.socket | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.connections = 0

    def url_for(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

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
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(src)
