"""Prometheus series: the hook's per message and iteration, the plan and tuner, GPUs and host.

A training job serves them per rank (`Exporter`, with ``Config.metrics_port``); ``autotune
daemon`` serves a node's GPUs and host for jobs that should not. Collectors read at scrape time.
"""

from __future__ import annotations

from autotune.metrics._daemon import run_daemon
from autotune.metrics._exporter import Exporter
from autotune.metrics._hook import LATENCY_BUCKETS_S, HookMetrics
from autotune.metrics._host import HostMetrics
from autotune.metrics._nccl import NcclMetrics, NcclNodeMetrics
from autotune.metrics._nvml import GpuReading, NvmlMetrics, NvmlQuery, NvmlUnavailable, PynvmlQuery
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
