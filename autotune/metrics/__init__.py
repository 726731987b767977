"""Prometheus series: the hook's per message and iteration, the plan and tuner, GPUs and host.

A training job serves them per rank (`Exporter`, with ``Config.metrics_port``); ``autotune
daemon`` serves a node's GPUs and host for jobs that should not. Collectors read at scrape time.
The names load on first use, so that the daemon imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.util.lazy import lazy

if TYPE_CHECKING:
    from autotune.metrics._daemon import run_daemon
    from autotune.metrics._exporter import Exporter
    from autotune.metrics._hook import LATENCY_BUCKETS_S, HookMetrics
    from autotune.metrics._host import HostMetrics
    from autotune.metrics._nccl import NcclMetrics, NcclNodeMetrics
    from autotune.metrics._nvml import (
        GpuReading,
        NvmlMetrics,
        NvmlQuery,
        NvmlUnavailable,
        PynvmlQuery,
    )
    from autotune.metrics._server import Server

__all__ = [
    "LATENCY_BUCKETS_S",
    "Exporter",
    "GpuReading",
    "HookMetrics",
    "HostMetrics",
    "NcclMetrics",
    "NcclNodeMetrics",
    "NvmlMetrics",
    "NvmlQuery",
    "NvmlUnavailable",
    "PynvmlQuery",
    "Server",
    "run_daemon",
]

_HOME: dict[str, tuple[str, str | None]] = {
    "run_daemon": ("autotune.metrics._daemon", "run_daemon"),
    "Exporter": ("autotune.metrics._exporter", "Exporter"),
    "LATENCY_BUCKETS_S": ("autotune.metrics._hook", "LATENCY_BUCKETS_S"),
    "HookMetrics": ("autotune.metrics._hook", "HookMetrics"),
    "HostMetrics": ("autotune.metrics._host", "HostMetrics"),
    "NcclMetrics": ("autotune.metrics._nccl", "NcclMetrics"),
    "NcclNodeMetrics": ("autotune.metrics._nccl", "NcclNodeMetrics"),
    "GpuReading": ("autotune.metrics._nvml", "GpuReading"),
    "NvmlMetrics": ("autotune.metrics._nvml", "NvmlMetrics"),
    "NvmlQuery": ("autotune.metrics._nvml", "NvmlQuery"),
    "NvmlUnavailable": ("autotune.metrics._nvml", "NvmlUnavailable"),
    "PynvmlQuery": ("autotune.metrics._nvml", "PynvmlQuery"),
    "Server": ("autotune.metrics._server", "Server"),
}
__getattr__, __dir__ = lazy(__name__, _HOME, globals())
