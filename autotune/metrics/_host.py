"""The machine's and the training process's CPU, memory and network, read at scrape time (psutil).

psutil counts network traffic per interface for the whole machine; no per-process figure exists.
The process's own all-reduce traffic is in ``autotune_p2p_sent_bytes_total``.

The machine's series carry ``Hostname`` (as dcgm-exporter's do): every exporter on a machine
reports the same readings, and dashboards keep one line per machine with ``max by (Hostname)``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["HostMetrics"]


class HostMetrics(Collector):
    """Host and process readings; ``labels`` go on every series (the rank, in a training job)."""

    def __init__(self, labels: Mapping[str, str] | None = None, pid: int | None = None) -> None:
        import psutil  # lazily: only processes that export metrics pay for it

        self.labels = dict(labels or {})
        self.hostname = socket.gethostname()
        self._process = psutil.Process(pid)
        self._psutil = psutil

    def collect(self) -> Iterator[Metric]:
        psutil = self._psutil
        names, values = list(self.labels), list(self.labels.values())
        # The machine's series: the same from every exporter on it, told apart by Hostname.
        host_names, host_values = [*names, "Hostname"], [*values, self.hostname]

        cpu = CounterMetricFamily(
            "autotune_host_cpu_seconds",
            "CPU time of the whole machine, by mode, summed over cores.",
            labels=[*host_names, "mode"],
        )
        times = psutil.cpu_times()
        for mode in ("user", "system", "idle", "iowait", "irq", "softirq", "steal", "nice"):
            if hasattr(times, mode):
                cpu.add_metric([*host_values, mode], getattr(times, mode))
        yield cpu
        cores = GaugeMetricFamily(
            "autotune_host_cpus", "Logical CPUs of the machine.", labels=host_names
        )
        cores.add_metric(host_values, psutil.cpu_count() or 0)
        yield cores

        memory = psutil.virtual_memory()
        for name, help_text, value in (
            ("autotune_host_memory_total_bytes", "Physical memory of the machine.", memory.total),
            ("autotune_host_memory_available_bytes", "Memory available without swapping.",
             memory.available),
        ):  # fmt: skip
            g = GaugeMetricFamily(name, help_text, labels=host_names)
            g.add_metric(host_values, value)
            yield g

        received = CounterMetricFamily(
            "autotune_host_network_receive_bytes",
            "Bytes the machine received, by network interface.",
            labels=[*host_names, "interface"],
        )
        sent = CounterMetricFamily(
            "autotune_host_network_transmit_bytes",
            "Bytes the machine sent, by network interface.",
            labels=[*host_names, "interface"],
        )
        for nic, io in sorted(psutil.net_io_counters(pernic=True).items()):
            received.add_metric([*host_values, nic], io.bytes_recv)
            sent.add_metric([*host_values, nic], io.bytes_sent)
        yield received
        yield sent

        p = self._process
        with p.oneshot():
            ptimes, rss, threads = p.cpu_times(), p.memory_info().rss, p.num_threads()
        pcpu = CounterMetricFamily(
            "autotune_process_cpu_seconds",
            "CPU time of this process (all its threads, the training's and autotune's), by mode.",
            labels=[*names, "mode"],
        )
        pcpu.add_metric([*values, "user"], ptimes.user)
        pcpu.add_metric([*values, "system"], ptimes.system)
        yield pcpu
        for name, help_text, value in (
            ("autotune_process_resident_memory_bytes", "Resident memory of this process.", rss),
            ("autotune_process_threads", "Threads of this process.", threads),
        ):
            g = GaugeMetricFamily(name, help_text, labels=names)
            g.add_metric(values, value)
            yield g
