"""A scraper that dies mid-request costs the exporter nothing: the next scrape is served."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from autotune.metrics import Server


def test_dead_scrapes_leave_the_endpoint_serving() -> None:
    registry = CollectorRegistry()
    Counter("autotune_test_things", "Things.", registry=registry).inc(3)
    server = Server(registry, 0, "127.0.0.1", "a test")
    try:
        for request in (b"", b"GET /metr", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                s.sendall(request)  # then hang up before (or without) reading the answer
                s.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                )
        with urllib.request.urlopen(server.url, timeout=10) as response:
            body = response.read().decode()
        assert "autotune_test_things_total 3.0" in body
    finally:
        server.close()
