"""A TCP proxy between workers and PostgreSQL that can cut the link: `drop` resets every
connection (and refuses new ones while `refusing`), `stall` stops forwarding bytes in both
directions until `resume`, so statements hang mid-flight and leases run out."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from types import TracebackType

_CHUNK = 65536


def _reset(sock: socket.socket) -> None:
    """Close with an RST, as a dead middlebox or a pulled cable looks to both ends."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class Proxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self.refusing = False
        self.connections = 0  # accepted in all
        self.refused = 0  # reset at once while refusing
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="proxy-accept")

    def start(self) -> Proxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        _reset(self._listener)
        self.drop()

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- faults ---------------------------------------------------------------------------

    def drop(self) -> int:
        """Reset every open connection; returns how many there were."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, server in pairs:
            _reset(client)
            _reset(server)
        return len(pairs)

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    # -- plumbing -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                self.refused += 1
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._pairs.append((client, server))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while True:
                readable, _, _ = select.select(list(peers), [], [], 0.5)
                if self._closed:
                    return
                for sock in readable:
                    self._flowing.wait()  # a stall holds the bytes already read, too
                    data = sock.recv(_CHUNK)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return  # reset by drop(), or by either end
        finally:
            with self._lock:
                if (client, server) in self._pairs:
                    self._pairs.remove((client, server))
            _reset(client)
            _reset(server)
