"""``autotune daemon``: a node exporter of GPU (NVML) and host series, for every GPU on the node,
and of every NCCL process's collectives where NCCL loaded autotune's profiler."""

from __future__ import annotations

import importlib.util
import signal
import threading
from types import FrameType

from prometheus_client import CollectorRegistry

from autotune.metrics._host import HostMetrics
from autotune.metrics._nccl import NcclNodeMetrics
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
    nccl_dir: str | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT (or ``stop``), then shut the server down; return 0.

    With autotune-nccl installed, every process on the node whose NCCL loaded its profiler is
    served too (its shared file in ``nccl_dir``: AUTOTUNE_NCCL_SHM_DIR, default /dev/shm)."""
    registry = CollectorRegistry()
    registry.register(NvmlMetrics(nvml))
    registry.register(HostMetrics())
    if importlib.util.find_spec("autotune_nccl") is not None:
        registry.register(NcclNodeMetrics(nccl_dir))
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
