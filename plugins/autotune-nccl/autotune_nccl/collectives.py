"""Every collective NCCL ran, summed per (collective, size class, algorithm, protocol), joined with
NCCL's own prediction for it: its model error, and the regret of its own choice.

`Collectives.add` takes the profiler's records (`Profiler.drain`) and the tuner's predictions
(`Tuner.predictions`); what it keeps is what autotune's exporter serves (docs/NCCL_PROFILER.md):

- per cell: collectives, bytes, a kernel-time histogram, bus bandwidth (nccl-tests' factors),
  and, where NCCL's prediction for that communicator, collective and size is known, the sum of
  predicted and of measured time (their ratio is NCCL's model error: 1 is exact, 0.5 means NCCL
  expected half the time the kernel took);
- per (collective, size class), where two or more cells were measured (the tuner's screening
  runs several) and NCCL's own choice is one of them: the regret, the median time of NCCL's choice
  over the best measured cell's (1: NCCL chose the best one measured);
- from NCCL 2.31 (profiler v7): collectives per kernel variant and symmetric flag, and the time
  of each phase of symmetric kernels (initial sync, compute, final sync: each its longest
  channel's);
- what recording them cost NCCL's threads: the plugin's own time, summed over the records.

A record joins a prediction by communicator (NCCL's commHash; NCCL 2.27 and older give the tuner
none, so there any communicator of the same size matches), collective and NCCL's byte count,
which for all-gather and reduce-scatter is the gathered buffer (the record's bytes x ranks).
Pure Python, no dependency: the exporter adds the labels and the Prometheus types.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from autotune_nccl import Prediction
from autotune_nccl.profiler import PHASES, Record

__all__ = [
    "KERNEL_BUCKETS_S",
    "Cell",
    "Collectives",
    "Regret",
    "bus_factor",
    "cell_of",
    "size_class",
    "spelled",
]

#: Kernel-time histogram bounds, seconds: 1 us to 4 s, four per decade.
KERNEL_BUCKETS_S: tuple[float, ...] = tuple(
    round(m * 10.0**e, 9) for e in range(-6, 1) for m in (1.0, 1.8, 3.2, 5.6)
)
#: Measurements of a cell kept for its median (the regret).
WINDOW = 64
#: Measurements a cell needs before it counts towards the regret.
MIN_SAMPLES = 3
_GATHERED = ("AllGather", "ReduceScatter")
_PROTOCOLS = {"LL": "LL", "LL128": "LL128", "SIMPLE": "Simple"}


def size_class(nbytes: int) -> int:
    """The power of two ``nbytes`` rounds up to (autotune's size classes: (c/2, c])."""
    return 1 << max(nbytes - 1, 0).bit_length()


def bus_factor(func: str, nranks: int) -> float:
    """nccl-tests' bus bandwidth factor (busbw = algbw x factor), on the record's bytes."""
    if nranks <= 1:
        return 1.0
    if func == "AllReduce":
        return 2 * (nranks - 1) / nranks
    if func in _GATHERED:
        return float(nranks - 1)  # (n-1)/n of the gathered buffer, which is n x the record's
    return 1.0


def cell_of(r: Record) -> tuple[str, str]:
    """A record's (algorithm, protocol), in the tuner's spelling ("ring", "Simple")."""
    return spelled(r.algorithm, r.protocol)


def spelled(algorithm: str, protocol: str) -> tuple[str, str]:
    """NCCL's names ("RING", "SIMPLE") as the tuner spells them ("ring", "Simple")."""
    return algorithm.lower(), _PROTOCOLS.get(protocol.upper(), protocol)


@dataclass
class Cell:
    """One (collective, size class, algorithm, protocol): what NCCL's runs of it took."""

    count: int = 0
    nbytes: int = 0
    kernel_s: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(KERNEL_BUCKETS_S) + 1))
    bus_bytes: float = 0.0  # bytes x the bus factor, over kernel_s: the mean bus bandwidth
    recent_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    joined: int = 0  # runs with NCCL's prediction known
    predicted_s: float = 0.0  # NCCL's predictions for those runs
    measured_s: float = 0.0  # and what the kernels took

    def observe(self, seconds: float, nbytes: int, factor: float) -> None:
        self.count += 1
        self.nbytes += nbytes
        self.kernel_s += seconds
        self.buckets[bisect.bisect_left(KERNEL_BUCKETS_S, seconds)] += 1
        self.bus_bytes += nbytes * factor
        self.recent_s.append(seconds)

    @property
    def busbw(self) -> float:
        """Bytes per second on the bus, over the run so far (0 before a timed run)."""
        return self.bus_bytes / self.kernel_s if self.kernel_s > 0 else 0.0

    @property
    def model_error(self) -> float | None:
        """NCCL's predicted over measured time (None: no prediction joined)."""
        return self.predicted_s / self.measured_s if self.measured_s > 0 else None

    def cumulative(self) -> list[tuple[str, float]]:
        """The histogram as Prometheus wants it: cumulative counts by upper bound, then +Inf."""
        out, total = [], 0
        for bound, n in zip((*map(str, KERNEL_BUCKETS_S), "+Inf"), self.buckets, strict=True):
            total += n
            out.append((bound, float(total)))
        return out


@dataclass(frozen=True)
class Regret:
    """NCCL's own choice against the best cell measured, for one (collective, size class)."""

    ratio: float  # median time of NCCL's choice over the best cell's
    nccl_choice: tuple[str, str]
    best: tuple[str, str]
    cells: int  # cells measured


class Collectives:
    """The sums, kept across drains (one per process; the exporter owns it)."""

    def __init__(self) -> None:
        #: (collective, size class, algorithm, protocol) -> Cell
        self.cells: dict[tuple[str, int, str, str], Cell] = {}
        #: (collective, size class) -> NCCL's own choice, from its predictions
        self.nccl_choice: dict[tuple[str, int], tuple[str, str]] = {}
        self.untimed = 0  # records without a kernel time (no channel stopped)
        self.clocks: dict[str, int] = {}
        self.versions: set[int] = set()
        #: (collective, size class, algorithm, protocol, kernel variant, symmetric) -> count,
        #: where NCCL said (v7)
        self.variants: dict[tuple[str, int, str, str, str, bool], int] = {}
        #: (collective, size class, kernel variant, phase) -> [seconds, count]: symmetric kernels
        self.phases: dict[tuple[str, int, str, str], list[float]] = {}
        self.cost_s = 0.0  # the plugin's own time for the records it timed, summed
        self.timed = 0  # records whose cost was timed
        self._predictions: dict[tuple[str, int], list[Prediction]] = {}
        self._ranks: set[int] = set()  # the rank counts the predictions are for

    def add(self, records: Iterable[Record], predictions: Sequence[Prediction] = ()) -> int:
        """Fold in drained records (and the predictions known now); returns how many."""
        if predictions:
            self._index(predictions)
        n = 0
        for r in records:
            n += 1
            self.versions.add(r.version)
            self.clocks[r.clock] = self.clocks.get(r.clock, 0) + 1
            if r.cost_ns > 0:  # timed: every 16th of a communicator
                self.timed += 1
                self.cost_s += r.cost_ns / 1e9
            self._add_v7(r)
            if r.kernel_ns <= 0:
                self.untimed += 1
                continue
            algo, proto = cell_of(r)
            key = (r.func, size_class(r.nbytes), algo, proto)
            cell = self.cells.get(key)
            if cell is None:
                cell = self.cells[key] = Cell()
            seconds = r.kernel_ns / 1e9
            cell.observe(seconds, r.nbytes, bus_factor(r.func, r.nranks))
            p = self._prediction(r)
            if p is not None and (algo, proto) in p.cost_us:
                cell.joined += 1
                cell.predicted_s += p.cost_us[(algo, proto)] / 1e6
                cell.measured_s += seconds
        return n

    def _add_v7(self, r: Record) -> None:
        """What profiler v7 adds: the variant and symmetric flag, and the phases."""
        if r.symmetric is None:
            return
        cls = size_class(r.nbytes)
        algo, proto = cell_of(r)
        key = (r.func, cls, algo, proto, r.kernel_variant, r.symmetric)
        self.variants[key] = self.variants.get(key, 0) + 1
        if r.phases_seen <= 0:
            return
        for name, ns in zip(PHASES, r.phase_ns, strict=True):
            if ns > 0:
                sums = self.phases.setdefault((r.func, cls, r.kernel_variant, name), [0.0, 0])
                sums[0] += ns / 1e9
                sums[1] += 1

    def knows(self, records: Iterable[Record]) -> bool:
        """Whether every record's (collective, NCCL bytes) has a prediction indexed already
        (else the caller refreshes them before `add`)."""
        return all(self._prediction(r) is not None for r in records)

    def regret(self) -> dict[tuple[str, int], Regret]:
        """Per (collective, size class) where NCCL's choice and another cell were measured."""
        medians: dict[tuple[str, int], dict[tuple[str, str], float]] = {}
        for (func, cls, algo, proto), cell in self.cells.items():
            if len(cell.recent_s) >= MIN_SAMPLES:
                medians.setdefault((func, cls), {})[(algo, proto)] = statistics.median(
                    cell.recent_s
                )
        out = {}
        for key, times in medians.items():
            choice = self.nccl_choice.get(key)
            if choice is None or choice not in times or len(times) < 2:
                continue
            best = min(times, key=lambda c: times[c])
            out[key] = Regret(times[choice] / times[best], choice, best, len(times))
        return out

    def _index(self, predictions: Sequence[Prediction]) -> None:
        self._predictions = {}
        self._ranks = {p.nranks for p in predictions}
        for p in predictions:
            self._predictions.setdefault((p.func, p.nbytes), []).append(p)
            if p.nccl_choice is not None:
                nbytes = p.nbytes // p.nranks if p.func in _GATHERED and p.nranks else p.nbytes
                self.nccl_choice[(p.func, size_class(nbytes))] = p.nccl_choice

    def _prediction(self, r: Record) -> Prediction | None:
        """NCCL's prediction for ``r``: same collective and NCCL byte count, same rank count
        (any, where the record has none: v3), same communicator (either unknown: any)."""
        for nranks in (r.nranks,) if r.nranks else self._ranks:
            nbytes = r.nbytes * nranks if r.func in _GATHERED else r.nbytes
            for p in self._predictions.get((r.func, nbytes), ()):
                if r.nranks and p.nranks != nranks:
                    continue
                if p.comm_id == r.comm_id or 0 in (p.comm_id, r.comm_id):
                    return p
        return None
