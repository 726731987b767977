"""The per-rank exporter a training job runs: the hook's, the host's and its GPU's series."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from autotune.comm import topology
from autotune.comm.nccl_feed import NcclFeed, feed
from autotune.metrics._hook import HookMetrics
from autotune.metrics._host import HostMetrics
from autotune.metrics._nccl import NcclMetrics
from autotune.metrics._nvml import GpuReading, NvmlMetrics, NvmlQuery
from autotune.metrics._server import Server

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from autotune.config import Config
    from autotune.ddp.engine import Engine
    from autotune.tuning import Tuner
    from autotune.tuning.unhooked import Unhooking

__all__ = ["Exporter"]

log = logging.getLogger("autotune.metrics")


class Exporter:
    """Serves one rank's series on ``Config.metrics_port`` + local rank (0: any free port).

    Every series carries ``rank`` (in ``group``, the job's) and ``local_rank`` (and ``job``, if
    ``Config.job`` is set). The GPU series are this rank's own GPU only, so ranks sharing a node
    do not report a GPU twice; ``autotune daemon`` serves a node's GPUs for jobs that should not.
    """

    def __init__(
        self,
        config: Config,
        group: ProcessGroup,
        engine: Engine,
        tuner: Tuner | None = None,
        nvml: NvmlQuery | None = None,
        unhooking: Unhooking | None = None,
        nccl: NcclFeed | None = None,
    ) -> None:
        assert config.metrics_port is not None
        rank = dist.get_rank(group)
        local_rank = topology.local_rank(default=rank)
        labels = {"rank": str(rank), "local_rank": str(local_rank)}
        if config.job is not None:
            labels["job"] = config.job
        self.engine = engine
        self.registry = CollectorRegistry()
        self.hook = HookMetrics(engine, tuner, labels, unhooking)
        self.registry.register(self.hook)
        self.registry.register(HostMetrics(labels))
        self.registry.register(NvmlMetrics(nvml, labels, select=self._own_gpu))
        # NCCL's own collectives, where NCCL loaded autotune's profiler plugin in this process.
        source = nccl if nccl is not None else feed()
        self.nccl = NcclMetrics(source, labels) if source is not None else None
        if self.nccl is not None:
            self.registry.register(self.nccl)
        port = config.metrics_port + local_rank if config.metrics_port else 0
        setting = (
            f"Config.metrics_port / AUTOTUNE_METRICS_PORT (now {config.metrics_port}; this rank "
            f"serves it + local rank {local_rank}, so the first port must leave room for every "
            "local rank below 65536)"
        )
        self.server = Server(self.registry, port, config.metrics_host, setting)
        #: Each rank's endpoint (None: it serves none), once the ranks have told each other at
        #: setup (`AutotuneState`); empty before.
        self.endpoints: dict[int, str | None] = {}
        self.registry.register(_Endpoints(self, labels))
        if not config.metrics_port:  # any free port: say which, or nobody can scrape it
            log.info("autotune metrics: rank %s serves %s", labels["rank"], self.server.url)
        if self.nccl is not None:  # this rank serves them: `autotune daemon` leaves them out
            self.nccl.feed.source.mark_served(self.server.port)

    @property
    def port(self) -> int:
        return self.server.port

    def close(self) -> None:
        self.server.close()
        if self.nccl is not None:
            self.nccl.close()

    def _own_gpu(self, reading: GpuReading) -> bool:
        device = self.engine.device
        if device is None or device.type != "cuda":
            return False  # a CPU rank, or no gradients yet: no GPU of its own
        props = torch.cuda.get_device_properties(device)
        # NVML says "GPU-<uuid>", torch the bare UUID; NVML's indices ignore CUDA_VISIBLE_DEVICES.
        return reading.uuid.lower().removeprefix("gpu-") == str(props.uuid).lower().removeprefix(
            "gpu-"
        )


class _Endpoints(Collector):
    """``autotune_metrics_endpoints{state}``: how many of the job's ranks serve an endpoint and
    how many serve none (a port in use), so a dashboard or an alert sees the ranks it cannot
    scrape from any rank it can."""

    def __init__(self, exporter: Exporter, labels: dict[str, str]) -> None:
        self.exporter = exporter
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        endpoints = self.exporter.endpoints
        if not endpoints:
            return
        g = GaugeMetricFamily(
            "autotune_metrics_endpoints",
            "The job's ranks that serve a metrics endpoint (state=serving) and that serve none "
            "(state=none: its port was in use; that rank trains on, unscraped)",
            labels=[*self.labels, "state"],
        )
        serving = sum(1 for url in endpoints.values() if url is not None)
        g.add_metric([*self.labels.values(), "serving"], serving)
        g.add_metric([*self.labels.values(), "none"], len(endpoints) - serving)
        yield g
