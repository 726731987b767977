"""``autotune daemon``: a node exporter of GPU (NVML) and host series, for every GPU on the node."""

from __future__ import annotations

import signal
import threading
from types import FrameType

from prometheus_client import CollectorRegistry

from autotune.metrics._host import HostMetrics
from autotune.metrics._nvml import NvmlMetrics, NvmlQuery
from autotune.metrics._server import Server

__all__ = ["run_daemon"]


def run_daemon(
    host: str,
    port: int,
    *,
    nvml: NvmlQuery | None = None,
    stop: threading.Event | None = None,
    ready: threading.Event | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT (or ``stop``), then shut the server down; return 0."""
    registry = CollectorRegistry()
    registry.register(NvmlMetrics(nvml))
    registry.register(HostMetrics())
    server = Server(registry, port, host, "--port")
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
    print(f"autotune daemon: serving {server.url}", flush=True)
    if ready is not None:
        ready.set()
    stop.wait()
    server.close()
    print("autotune daemon: stopped", flush=True)
    return 0
