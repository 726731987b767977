"""The GPUs and host dashboard, laid out like dcgm-exporter's: one row of GPU panels per reading,
then the host and the training processes."""

from __future__ import annotations

from typing import Any

from autotune.dashboards._sdk import Sdk

__all__ = ["UID", "gpus_and_host"]

UID = "autotune-gpus-host"
_HOST = 'job=~"$job", instance=~"$instance"'
_GPU = 'job=~"$job", instance=~"$instance", gpu=~"$gpu"'
_RATE = "[$__rate_interval]"
_LEGEND = "GPU {{gpu}} {{Hostname}}"
# A GPU or a machine can be reported by several exporters (its ranks and the daemon); these keep
# one series per GPU and per machine.
_PER_GPU = "max by (Hostname, gpu, UUID, modelName)"
_PER_HOST = "max by (Hostname)"


def gpus_and_host(s: Sdk) -> Any:
    d = (
        s.new_dashboard(
            "autotune / GPUs and host",
            UID,
            "NVML readings of the training ranks' GPUs (and of autotune daemon's), with "
            "dcgm-exporter's gpu and UUID labels; the host's CPU, memory and network, and each "
            "training process's CPU and memory.",
        )
        .with_variable(s.datasource_variable())
        .with_variable(s.label_variable("job", "label_values(autotune_host_cpus, job)"))
        .with_variable(
            s.label_variable("instance", 'label_values(autotune_host_cpus{job=~"$job"}, instance)')
        )
        .with_variable(
            s.label_variable(
                "gpu",
                f"label_values(autotune_gpu_memory_total_bytes{{{_HOST}}}, gpu)",
            )
        )
    )
    d = d.with_row(s.row("GPUs"))

    def sel(metric: str) -> str:
        return f"{metric}{{{_GPU}}}"

    def gpu(metric: str) -> str:
        return f"{_PER_GPU} ({sel(metric)})"

    panels = [
        s.timeseries_panel(
            "GPU temperature",
            "Core temperature.",
            "celsius",
            [s.query(gpu("autotune_gpu_temperature_celsius"), _LEGEND)],
            width=18,
            minimum=None,
        ),
        s.stat_panel(
            "GPU average temperature",
            "Over the selected GPUs.",
            "celsius",
            [s.query(f"avg({gpu('autotune_gpu_temperature_celsius')})", "average")],
            height=8,
        ),
        s.timeseries_panel(
            "GPU power usage",
            "Power drawn.",
            "watt",
            [s.query(gpu("autotune_gpu_power_watts"), _LEGEND)],
            width=18,
        ),
        s.stat_panel(
            "GPU power total",
            "Over the selected GPUs.",
            "watt",
            [s.query(f"sum({gpu('autotune_gpu_power_watts')})", "total")],
            height=8,
        ),
        s.timeseries_panel(
            "GPU SM clocks",
            "Streaming multiprocessor clock.",
            "hertz",
            [s.query(gpu("autotune_gpu_sm_clock_hertz"), _LEGEND)],
        ),
        s.timeseries_panel(
            "GPU utilization",
            "Fraction of time a kernel ran.",
            "percentunit",
            [s.query(gpu("autotune_gpu_utilization_ratio"), _LEGEND)],
        ),
        s.timeseries_panel(
            "GPU framebuffer memory used",
            "Memory in use, and each GPU's total (dashed in Grafana's legend order).",
            "bytes",
            [
                s.query(gpu("autotune_gpu_memory_used_bytes"), f"used, {_LEGEND}"),
                s.query(gpu("autotune_gpu_memory_total_bytes"), f"total, {_LEGEND}", ref="B"),
            ],
        ),
        s.stat_panel(
            "GPU energy over the time range",
            "Energy used in the dashboard's time range, per GPU (from NVML's counter).",
            "joule",
            [
                s.query(
                    f"{_PER_GPU} (increase({sel('autotune_gpu_energy_joules_total')}[$__range]))",
                    _LEGEND,
                )
            ],
            width=12,
            height=8,
        ),
        s.timeseries_panel(
            "PCIe throughput",
            "Bytes per second over PCIe, out of (TX) and into (RX) each GPU.",
            "Bps",
            [
                s.query(gpu("autotune_gpu_pcie_transmit_bytes_per_second"), f"TX {_LEGEND}"),
                s.query(gpu("autotune_gpu_pcie_receive_bytes_per_second"), f"RX {_LEGEND}", "B"),
            ],
        ),
        s.timeseries_panel(
            "NVLink throughput",
            "Bytes per second over all NVLinks of each GPU (GPUs without NVLink have no series).",
            "Bps",
            [
                s.query(
                    f"{_PER_GPU} (rate({sel('autotune_gpu_nvlink_transmit_bytes_total')}{_RATE}))",
                    f"TX {_LEGEND}",
                ),
                s.query(
                    f"{_PER_GPU} (rate({sel('autotune_gpu_nvlink_receive_bytes_total')}{_RATE}))",
                    f"RX {_LEGEND}",
                    "B",
                ),
            ],
        ),
        s.stat_panel(
            "NVML readable",
            "1 where NVML could be read at the last scrape; 0: no driver or library there.",
            "none",
            [s.query(f"min by (instance) (autotune_nvml_up{{{_HOST}}})", "{{instance}}")],
            width=12,
        ),
    ]
    for panel in panels:
        d = d.with_panel(panel)
    d = d.with_row(s.row("Host and training processes"))
    host = [
        s.timeseries_panel(
            "Host CPU busy",
            "Fraction of the machine's CPU time not idle, one line per machine.",
            "percentunit",
            [
                s.query(
                    f"1 - {_PER_HOST} (rate(autotune_host_cpu_seconds_total"
                    f'{{{_HOST}, mode="idle"}}{_RATE})) / {_PER_HOST} '
                    f"(autotune_host_cpus{{{_HOST}}})",
                    "{{Hostname}}",
                )
            ],
            width=8,
        ),
        s.timeseries_panel(
            "Host memory used",
            "Total minus available memory.",
            "bytes",
            [
                s.query(
                    f"{_PER_HOST} (autotune_host_memory_total_bytes{{{_HOST}}} - "
                    f"autotune_host_memory_available_bytes{{{_HOST}}})",
                    "{{Hostname}}",
                )
            ],
            width=8,
        ),
        s.timeseries_panel(
            "Host network",
            "Bytes per second received and sent, by interface (the machine's, not the process's).",
            "Bps",
            [
                s.query(
                    "max by (Hostname, interface) (rate(autotune_host_network_receive_bytes_total"
                    f"{{{_HOST}}}{_RATE}))",
                    "RX {{interface}} {{Hostname}}",
                ),
                s.query(
                    "max by (Hostname, interface) (rate(autotune_host_network_transmit_bytes_total"
                    f"{{{_HOST}}}{_RATE}))",
                    "TX {{interface}} {{Hostname}}",
                    "B",
                ),
            ],
            width=8,
        ),
        s.timeseries_panel(
            "Training process CPU",
            "CPU cores each training process keeps busy (its threads, the training's and "
            "autotune's).",
            "short",
            [
                s.query(
                    "sum by (instance, rank) (rate(autotune_process_cpu_seconds_total"
                    f'{{{_HOST}, rank!=""}}{_RATE}))',
                    "rank {{rank}}",
                )
            ],
        ),
        s.timeseries_panel(
            "Training process memory",
            "Resident memory of each training process.",
            "bytes",
            [
                s.query(
                    "max by (instance, rank) (autotune_process_resident_memory_bytes"
                    f'{{{_HOST}, rank!=""}})',
                    "rank {{rank}}",
                )
            ],
        ),
    ]
    for panel in host:
        d = d.with_panel(panel)
    return d
