"""Stand-ins for NVML where the machine has no GPU: readings the tests choose."""

from __future__ import annotations

from dataclasses import replace

from autotune.metrics import GpuReading, NvmlUnavailable


class FakeNvml:
    """An NVML device query that returns what the test says (None: NVML unavailable)."""

    def __init__(self, readings: list[GpuReading] | None) -> None:
        self._readings = readings

    def readings(self) -> list[GpuReading]:
        if self._readings is None:
            raise NvmlUnavailable("no driver")
        return self._readings


H100 = GpuReading(
    index=0,
    uuid="GPU-1111",
    name="NVIDIA H100",
    utilization_ratio=0.87,
    memory_used_bytes=40 << 30,
    memory_total_bytes=80 << 30,
    power_watts=512.5,
    energy_joules=123456.0,
    temperature_celsius=61.0,
    sm_clock_hertz=1.98e9,
    pcie_tx_bytes_per_second=2.5e9,
    pcie_rx_bytes_per_second=3.5e9,
    nvlink_tx_bytes=10 << 30,
    nvlink_rx_bytes=11 << 30,
)
# An older GPU: no NVLink, no energy counter, no PCIe throughput.
T4 = GpuReading(index=1, uuid="GPU-2222", name="Tesla T4", utilization_ratio=0.1, power_watts=35.0)
# A second H100 for a two-GPU node.
H100_B = replace(H100, index=1, uuid="GPU-3333")
