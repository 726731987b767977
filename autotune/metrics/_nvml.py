"""GPU readings from NVML at scrape time, labelled the way dcgm-exporter labels them.

`NvmlMetrics` asks an `NvmlQuery` for readings (pynvml's by default, imported lazily); a field a
GPU does not support is None and its series is left out. Without NVML at all, the only series is
``autotune_nvml_up 0`` and everything else keeps working.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["GpuReading", "NvmlMetrics", "NvmlQuery", "NvmlUnavailable", "PynvmlQuery"]

_log = logging.getLogger("autotune")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (no driver, no library, no permission)."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment; None where the GPU does not report a field."""

    index: int
    uuid: str
    name: str
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None  # since the driver loaded: a counter
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes: int | None = None  # counters, where the GPU has NVLink
    nvlink_rx_bytes: int | None = None


class NvmlQuery(Protocol):
    """Where readings come from: pynvml, or a fake in tests."""

    def readings(self) -> list[GpuReading]:
        """Every GPU's reading now; raise `NvmlUnavailable` if NVML cannot be used."""
        ...


#: (field, metric name, help, kind) for each series a reading can give.
_SERIES: tuple[tuple[str, str, str, str], ...] = (
    ("utilization_ratio", "autotune_gpu_utilization_ratio",
     "Fraction of time a kernel ran on the GPU over the last sample period.", "gauge"),
    ("memory_used_bytes", "autotune_gpu_memory_used_bytes", "GPU memory in use.", "gauge"),
    ("memory_total_bytes", "autotune_gpu_memory_total_bytes", "GPU memory in all.", "gauge"),
    ("power_watts", "autotune_gpu_power_watts", "Power drawn by the GPU.", "gauge"),
    ("energy_joules", "autotune_gpu_energy_joules",
     "Energy the GPU used since the driver loaded.", "counter"),
    ("temperature_celsius", "autotune_gpu_temperature_celsius", "GPU core temperature.", "gauge"),
    ("sm_clock_hertz", "autotune_gpu_sm_clock_hertz", "Streaming multiprocessor clock.", "gauge"),
    ("pcie_tx_bytes_per_second", "autotune_gpu_pcie_transmit_bytes_per_second",
     "PCIe throughput out of the GPU.", "gauge"),
    ("pcie_rx_bytes_per_second", "autotune_gpu_pcie_receive_bytes_per_second",
     "PCIe throughput into the GPU.", "gauge"),
    ("nvlink_tx_bytes", "autotune_gpu_nvlink_transmit_bytes",
     "Bytes the GPU sent over NVLink, all links.", "counter"),
    ("nvlink_rx_bytes", "autotune_gpu_nvlink_receive_bytes",
     "Bytes the GPU received over NVLink, all links.", "counter"),
)  # fmt: skip
assert {s[0] for s in _SERIES} == {f.name for f in fields(GpuReading)} - {"index", "uuid", "name"}


class NvmlMetrics(Collector):
    """GPU series with dcgm-exporter's ``gpu``, ``UUID``, ``modelName`` and ``Hostname`` labels.

    ``select`` keeps some GPUs only (a training rank reports its own); ``labels`` go on every
    series (the rank, in a training job).
    """

    def __init__(
        self,
        query: NvmlQuery | None = None,
        labels: Mapping[str, str] | None = None,
        select: Callable[[GpuReading], bool] | None = None,
    ) -> None:
        if query is None:  # a rank's: its host's first rank says it once, for every rank there
            query = PynvmlQuery(warn=dict(labels or {}).get("local_rank", "0") == "0")
        self.query = query
        self.labels = dict(labels or {})
        self.select = select
        self.hostname = socket.gethostname()

    def collect(self) -> Iterator[Metric]:
        names, values = list(self.labels), list(self.labels.values())
        up = GaugeMetricFamily(
            "autotune_nvml_up", "1 if NVML could be read at this scrape, else 0.", labels=names
        )
        try:
            readings = self.query.readings()
        except NvmlUnavailable:
            up.add_metric(values, 0)
            yield up
            return
        up.add_metric(values, 1)
        yield up
        if self.select is not None:
            readings = [r for r in readings if self.select(r)]
        per_gpu = [*names, "gpu", "UUID", "modelName", "Hostname"]
        for attr, name, help_text, kind in _SERIES:
            family: GaugeMetricFamily | CounterMetricFamily
            if kind == "counter":
                family = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=per_gpu)
            else:
                family = GaugeMetricFamily(name, help_text, labels=per_gpu)
            for r in readings:
                value = getattr(r, attr)
                if value is not None:  # not supported by this GPU: left out, not faked
                    family.add_metric([*values, str(r.index), r.uuid, r.name, self.hostname], value)
            if family.samples:
                yield family


class PynvmlQuery:
    """Readings through nvidia-ml-py (``import pynvml``), initialised on first use.

    ``warn``: say at WARNING, once, that NVML is unavailable; else at DEBUG. The ranks of a host
    share its NVML: only the first (local rank 0) says it, once per host, not once per rank."""

    def __init__(self, warn: bool = True) -> None:
        self.warn = warn
        self._lock = threading.Lock()
        self._pynvml: Any = None
        self._failure: str | None = None

    def readings(self) -> list[GpuReading]:
        nvml = self._init()
        return [self._read(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]

    def _init(self) -> Any:
        with self._lock:
            if self._pynvml is not None:
                return self._pynvml
            if self._failure is None:
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self._pynvml = pynvml
                    return pynvml
                except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, ...
                    self._failure = f"{type(exc).__name__}: {exc}"
                    _log.log(
                        logging.WARNING if self.warn else logging.DEBUG,
                        "autotune: no GPU metrics, NVML is unavailable (%s)",
                        self._failure,
                    )
            raise NvmlUnavailable(self._failure)

    @staticmethod
    def _read(nvml: Any, index: int) -> GpuReading:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)

        def field(read: Callable[[], Any], scale: float = 1.0) -> Any:
            # Each field on its own: one a GPU does not support must not hide the others.
            try:
                value = read()
            except nvml.NVMLError:
                return None
            return value * scale if scale != 1.0 else value

        def text(value: Any) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        memory = field(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        links = field(lambda: _field_value(nvml, handle, nvml.NVML_FI_DEV_NVLINK_LINK_COUNT))
        nvlink = bool(links)
        return GpuReading(
            index=index,
            uuid=text(nvml.nvmlDeviceGetUUID(handle)),
            name=text(nvml.nvmlDeviceGetName(handle)),
            utilization_ratio=field(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu, 0.01),
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_watts=field(lambda: nvml.nvmlDeviceGetPowerUsage(handle), 1e-3),  # mW
            energy_joules=field(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle), 1e-3),
            temperature_celsius=field(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            ),
            sm_clock_hertz=field(
                lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), 1e6
            ),
            pcie_tx_bytes_per_second=field(
                lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES), 1024
            ),  # KB/s
            pcie_rx_bytes_per_second=field(
                lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES), 1024
            ),
            nvlink_tx_bytes=field(
                lambda: _field_value(nvml, handle, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX), 1024
            )
            if nvlink
            else None,  # KiB, all links
            nvlink_rx_bytes=field(
                lambda: _field_value(nvml, handle, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX), 1024
            )
            if nvlink
            else None,
        )


def _field_value(nvml: Any, handle: Any, field_id: int) -> float:
    """One NVML field value; raises NVMLError if the GPU does not report it."""
    (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
    if value.nvmlReturn != nvml.NVML_SUCCESS:
        raise nvml.NVMLError(value.nvmlReturn)
    union = value.value
    member = {
        nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    }.get(value.valueType)
    if member is None:
        raise nvml.NVMLError(nvml.NVML_ERROR_UNKNOWN)
    return float(getattr(union, member))
