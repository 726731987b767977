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
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from autotune.comm.nccl_feed import NcclFeed

if TYPE_CHECKING:
    from autotune_nccl import Record
    from autotune_nccl.collectives import Cell, Collectives

__all__ = ["CELL_LABELS", "NcclMetrics", "NcclNodeMetrics"]

#: What a per-collective series is labelled by, after the exporter's own labels.
CELL_LABELS = ("collective", "size_class", "algorithm", "protocol")


def _cell_families(
    labels: list[str],
) -> tuple[HistogramMetricFamily, CounterMetricFamily, GaugeMetricFamily]:
    seconds = HistogramMetricFamily(
        "autotune_nccl_collective_seconds",
        "Kernel time of each NCCL collective (first channel start to last channel stop, "
        "NCCL's GPU timer), by collective, size class (bytes), algorithm and protocol.",
        labels=labels,
    )
    nbytes = CounterMetricFamily(
        "autotune_nccl_collective_bytes",
        "Bytes of NCCL's collectives (count x type size, per rank), by the same labels.",
        labels=labels,
    )
    busbw = GaugeMetricFamily(
        "autotune_nccl_busbw_bytes_per_second",
        "Bus bandwidth of NCCL's collectives over the run (nccl-tests' factors).",
        labels=labels,
    )
    return seconds, nbytes, busbw


def _add_cell(
    seconds: HistogramMetricFamily,
    nbytes: CounterMetricFamily,
    busbw: GaugeMetricFamily,
    key: list[str],
    cell: Cell,
) -> None:
    seconds.add_metric(key, cell.cumulative(), cell.kernel_s)
    nbytes.add_metric(key, cell.nbytes)
    busbw.add_metric(key, cell.busbw)


class NcclMetrics(Collector):
    """Sums what the feed hands it (`autotune.comm.nccl_feed`); serves them at scrape time."""

    def __init__(self, feed: NcclFeed, labels: Mapping[str, str] | None = None) -> None:
        from autotune_nccl.collectives import Collectives

        self.feed = feed
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
        predictions = [] if known else self.feed.source.predictions()
        with self._lock:
            self.collectives.add(records, predictions)

    def collect(self) -> Iterator[Metric]:
        self.feed.poll()
        names, values = list(self.labels), list(self.labels.values())
        per = [*names, *CELL_LABELS]
        seconds, nbytes, busbw = _cell_families(per)
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
                _add_cell(seconds, nbytes, busbw, key, cell)
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
            v7 = list(self._v7_families(names, values, c))
        yield from (seconds, nbytes, busbw, predicted, measured, error, regret)
        yield from v7
        yield from self._profiler_families(names, values, clocks)

    def _v7_families(self, names: list[str], values: list[str], c: Collectives) -> Iterator[Metric]:
        """What NCCL 2.31's profiler v7 adds, and what the profiler costs (under the lock)."""
        variants = CounterMetricFamily(
            "autotune_nccl_kernel_variant_collectives",
            "NCCL's collectives by the kernel variant it ran and whether that was a "
            "symmetric-memory kernel (NCCL 2.31, profiler v7; absent before).",
            labels=[*names, *CELL_LABELS, "kernel_variant", "symmetric"],
        )
        for (func, cls, algo, proto, variant, sym), n in sorted(c.variants.items()):
            key = [*values, func, str(cls), algo, proto, variant, str(sym).lower()]
            variants.add_metric(key, n)
        phases = SummaryMetricFamily(
            "autotune_nccl_kernel_phase_seconds",
            "Symmetric kernels' phases (initial_sync, compute, final_sync; NCCL 2.31), each "
            "its longest channel's GPU time.",
            labels=[*names, "collective", "size_class", "kernel_variant", "phase"],
        )
        for (func, cls, variant, phase), (total, count) in sorted(c.phases.items()):
            phases.add_metric([*values, func, str(cls), variant, phase], int(count), total)
        cost = SummaryMetricFamily(
            "autotune_nccl_profiler_cost_seconds",
            "The profiler plugin's own time in NCCL's calls, per recorded collective, measured "
            "on every 16th of a communicator (count: those timed; sum: their time in the "
            "plugin, a chained profiler's not included).",
            labels=names,
        )
        cost.add_metric(values, c.timed, c.cost_s)
        yield from (variants, phases, cost)

    def _profiler_families(
        self, names: list[str], values: list[str], clocks: dict[str, int]
    ) -> Iterator[Metric]:
        s = self.feed.source.stats()
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
        sampled = CounterMetricFamily(
            "autotune_nccl_profiler_sampled_out",
            "Collectives AUTOTUNE_NCCL_PROFILER_SAMPLE=N left out (every Nth is recorded).",
            labels=names,
        )
        sampled.add_metric(values, s.sampled_out)
        chain = CounterMetricFamily(
            "autotune_nccl_profiler_chain_calls",
            "NCCL's calls forwarded to the chained profiler (AUTOTUNE_NCCL_PROFILER_CHAIN), "
            "and its failures (library, symbol, init or a call; logged once).",
            labels=[*names, "result"],
        )
        chain.add_metric([*values, "forwarded"], s.chained)
        chain.add_metric([*values, "failed"], s.chain_failures)
        yield from (info, records, lost, odd, sampled, chain)


class NcclNodeMetrics(Collector):
    """``autotune daemon``'s view of every NCCL process on the node that loaded autotune's
    profiler: the sums each keeps in its shared file (`autotune_nccl.node`), labelled by the
    process (``pid``, and ``rank``, ``local_rank``, ``job`` from its environment). A process
    whose rank exporter serves them (a job with the hook and a metrics port) is left out."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        from autotune_nccl.collectives import Cell, bus_factor, spelled
        from autotune_nccl.node import read_node

        procs = ["pid", "rank", "local_rank", "job"]
        seconds, nbytes, busbw = _cell_families([*procs, *CELL_LABELS])
        lost = CounterMetricFamily(
            "autotune_nccl_profiler_lost",
            "Collectives NCCL ran that no series shows: ring_full, pool_full (as the rank's "
            "exporter counts them), cells_full (the shared file's 256 cells were taken).",
            labels=[*procs, "reason"],
        )
        info = GaugeMetricFamily(
            "autotune_nccl_profiler_info",
            "1 per process whose NCCL loaded autotune's profiler; version: the symbol it loaded.",
            labels=[*procs, "version"],
        )
        for view in read_node(self.directory):
            if view.served:
                continue  # its rank's exporter serves these (and more: NCCL's predictions)
            who = [str(view.pid), str(view.rank), str(view.local_rank), view.job]
            info.add_metric([*who, str(view.version)], 1.0)
            for reason, n in (
                ("ring_full", view.ring_full),
                ("pool_full", view.pool_full),
                ("cells_full", view.cells_full),
            ):
                lost.add_metric([*who, reason], n)
            merged: dict[tuple[str, int, str, str], Cell] = {}
            for c in view.cells:  # one series per cell, whatever the communicators' sizes
                algo, proto = spelled(c.algorithm, c.protocol)
                cell = merged.setdefault((c.func, c.size_class, algo, proto), Cell())
                cell.count += c.count
                cell.nbytes += c.nbytes
                cell.kernel_s += c.kernel_ns / 1e9
                cell.bus_bytes += c.nbytes * bus_factor(c.func, c.nranks)
                for i, n in enumerate(c.buckets):
                    cell.buckets[i] += n
            for (func, cls, algo, proto), cell in sorted(merged.items()):
                _add_cell(seconds, nbytes, busbw, [*who, func, str(cls), algo, proto], cell)
        yield from (seconds, nbytes, busbw, info, lost)
