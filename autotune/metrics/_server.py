"""Serving a registry over HTTP, with an error that says which port and which setting."""

from __future__ import annotations

import errno
import socket
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["Server"]


class Server:
    """``/metrics`` for one registry, on a thread, until `close`."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str, setting: str) -> None:
        """``setting`` names what the user changes to move the port (for the error message)."""
        if not 0 <= port <= 65535:
            raise ValueError(f"autotune metrics: port {port} is out of range; choose {setting}")
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except socket.gaierror as exc:
            raise ValueError(
                f"autotune metrics: cannot bind {host!r}, not an address of this machine "
                f"({exc.strerror}); use e.g. 127.0.0.1, or 0.0.0.0 for every interface"
            ) from exc
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise OSError(
                    exc.errno,
                    f"autotune metrics: port {port} on {host} is in use; choose another with "
                    f"{setting}",
                ) from exc
            if exc.errno == errno.EADDRNOTAVAIL:
                raise OSError(exc.errno, f"autotune metrics: cannot bind {host}: {exc}") from exc
            raise
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        self.host = host
        self.port: int = server.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
