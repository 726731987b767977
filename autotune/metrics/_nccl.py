"""NCCL's own collectives as Prometheus series, from autotune's NCCL profiler and tuner plugins.

Where NCCL loaded the profiler (``NCCL_PROFILER_PLUGIN``, the autotune-nccl library), every
collective of the process (DDP's, FSDP's, the user's, with or without the hook) is a record in
the library's ring; a daemon thread here drains it every half second into
`autotune_nccl.collectives.Collectives`, and a scrape reads the sums. Where the tuner plugin is
loaded too, NCCL's predicted time joins the measured one (model error, regret).
docs/NCCL_PROFILER.md lists the series and their NCCL Inspector equivalents.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from autotune.comm.nccl_feed import NcclFeed

if TYPE_CHECKING:
    from autotune_nccl import Record
    from autotune_nccl.collectives import Collectives

__all__ = ["NcclMetrics"]


class NcclMetrics(Collector):
    """Sums what the feed hands it (`autotune.comm.nccl_feed`); serves them at scrape time."""

    def __init__(self, feed: NcclFeed, labels: Mapping[str, str] | None = None) -> None:
        from autotune_nccl.collectives import Collectives

        self.feed = feed
        self.source = feed.source
        self.labels = dict(labels or {})
        self.collectives: Collectives = Collectives()
        self._lock = threading.Lock()
        feed.subscribe(self._add)

    def close(self) -> None:
        self.feed.poll()
        self.feed.unsubscribe(self._add)

    def _add(self, records: Sequence[Record]) -> None:
        with self._lock:
            known = self.collectives.knows(records)
        # NCCL's predictions are read again only for a collective and size not joined yet.
        predictions = [] if known else self.source.predictions()
        with self._lock:
            self.collectives.add(records, predictions)

    def collect(self) -> Iterator[Metric]:
        self.feed.poll()
        names, values = list(self.labels), list(self.labels.values())
        per = [*names, "collective", "size_class", "algorithm", "protocol"]
        seconds = HistogramMetricFamily(
            "autotune_nccl_collective_seconds",
            "Kernel time of each NCCL collective (first channel start to last channel stop, "
            "NCCL's GPU timer), by collective, size class (bytes), algorithm and protocol.",
            labels=per,
        )
        nbytes = CounterMetricFamily(
            "autotune_nccl_collective_bytes",
            "Bytes of NCCL's collectives (count x type size, per rank), by the same labels.",
            labels=per,
        )
        busbw = GaugeMetricFamily(
            "autotune_nccl_busbw_bytes_per_second",
            "Bus bandwidth of NCCL's collectives over the run (nccl-tests' factors).",
            labels=per,
        )
        predicted = CounterMetricFamily(
            "autotune_nccl_predicted_seconds",
            "NCCL's own predicted time (its tuner cost table) for the collectives it was known "
            "for; divide by autotune_nccl_measured_seconds for NCCL's model error.",
            labels=per,
        )
        measured = CounterMetricFamily(
            "autotune_nccl_measured_seconds",
            "Kernel time of the collectives whose prediction is known (the model error's base).",
            labels=per,
        )
        error = GaugeMetricFamily(
            "autotune_nccl_model_error_ratio",
            "NCCL's predicted over measured time (1: its model is exact; 0.5: the kernel took "
            "twice what NCCL expected).",
            labels=per,
        )
        regret = GaugeMetricFamily(
            "autotune_nccl_choice_regret_ratio",
            "Median time of NCCL's own choice over the best measured cell's, per collective "
            "and size class, where both were measured (1: NCCL chose the best).",
            labels=[*names, "collective", "size_class", "nccl_choice", "best"],
        )
        with self._lock:
            c = self.collectives
            for (func, cls, algo, proto), cell in sorted(c.cells.items()):
                key = [*values, func, str(cls), algo, proto]
                seconds.add_metric(key, cell.cumulative(), cell.kernel_s)
                nbytes.add_metric(key, cell.nbytes)
                busbw.add_metric(key, cell.busbw)
                if cell.joined:
                    predicted.add_metric(key, cell.predicted_s)
                    measured.add_metric(key, cell.measured_s)
                    if cell.model_error is not None:
                        error.add_metric(key, cell.model_error)
            for (func, cls), r in sorted(c.regret().items()):
                regret.add_metric(
                    [*values, func, str(cls), "/".join(r.nccl_choice), "/".join(r.best)], r.ratio
                )
            clocks = dict(c.clocks)
        yield from (seconds, nbytes, busbw, predicted, measured, error, regret)
        yield from self._profiler_families(names, values, clocks)

    def _profiler_families(
        self, names: list[str], values: list[str], clocks: dict[str, int]
    ) -> Iterator[Metric]:
        s = self.source.stats()
        info = GaugeMetricFamily(
            "autotune_nccl_profiler_info",
            "1 where NCCL loaded autotune's profiler; version: the symbol NCCL loaded "
            "(ncclProfiler_vN).",
            labels=[*names, "version"],
        )
        info.add_metric([*values, str(s.version)], 1.0 if s.version else 0.0)
        records = CounterMetricFamily(
            "autotune_nccl_profiler_records",
            "Collectives recorded, by the clock that timed them (gpu: NCCL's GPU timer; host: "
            "before NCCL 2.27; none: no channel ran).",
            labels=[*names, "clock"],
        )
        for clock, n in sorted(clocks.items()):
            records.add_metric([*values, clock], n)
        lost = CounterMetricFamily(
            "autotune_nccl_profiler_lost",
            "Collectives NCCL ran that no series shows: ring_full (not drained in time), "
            "pool_full (too many in flight).",
            labels=[*names, "reason"],
        )
        lost.add_metric([*values, "ring_full"], s.ring_full)
        lost.add_metric([*values, "pool_full"], s.pool_full)
        odd = CounterMetricFamily(
            "autotune_nccl_profiler_anomalies",
            "Events the profiler could not place: orphan (a handle or parent not its own), late "
            "(after finalize), stale (channels never came; recorded incomplete).",
            labels=[*names, "kind"],
        )
        for kind, n in (("orphan", s.orphans), ("late", s.late), ("stale", s.stale)):
            odd.add_metric([*values, kind], n)
        yield from (info, records, lost, odd)
