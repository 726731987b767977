"""What the engine measured, message by message, and the summaries `AutotuneState.stats` returns."""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "IterationRecord",
    "MessageRecord",
    "Recorder",
    "Summary",
    "bus_factor",
    "busbw_gbps",
    "quartiles",
    "summarize",
]


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor, 2(n-1)/n: busbw = algbw * this."""
    return 2 * (world_size - 1) / world_size


def busbw_gbps(nbytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth of ``nbytes`` in ``seconds``, in GB/s (1e9)."""
    if seconds <= 0 or world_size < 2:
        return 0.0
    return nbytes / seconds * bus_factor(world_size) / 1e9


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One all-reduce the engine ran: a bucket, a fusion of buckets, or a piece of a bucket."""

    iteration: int  # how many iterations (last buckets) had completed before it
    size_class: int
    nbytes: int
    algorithm: str
    segment_bytes: int | None
    seconds: float
    first_wait_s: float | None  # blocked waiting for the first peer's data (None: not observable)
    world_size: int
    started: float  # time.perf_counter() at its start, for timelines
    sent_bytes: int | None = None  # what this rank put on the wire (None: the backend's business)
    #: How ``seconds`` was taken: "host" (start to completion, as the host saw it: the CPU) or
    #: "cuda" (CUDA events, every message on a GPU, whatever runs it: from where its gradient
    #: is ready on the stream it starts on to its end on the GPU). One clock per device, so a
    #: size class compares its candidates on one.
    timer: str = "host"
    #: NCCL's own kernel time for the message, where its profiler is loaded and it ran one
    #: collective (`autotune.ddp.kernel_clock`); beside ``seconds``, never instead of it.
    kernel_s: float | None = None
    #: Of ``seconds``, how long this rank was blocked on its peers (receives, barriers); the
    #: rest is its own work: copies, sums, Python. None where the backend runs it.
    wait_s: float | None = None
    #: On a compressed wire (``algorithm`` ends ``+bf16`` or ``+fp16``), on a sample of messages:
    #: the relative error the cast added to this rank's gradients, ||g - cast(g)|| / ||g||.
    cast_error: float | None = None

    @property
    def busbw_gbps(self) -> float:
        """nccl-tests' bus bandwidth: algbw * 2(n-1)/n, in GB/s (1e9)."""
        return busbw_gbps(self.nbytes, self.seconds, self.world_size)


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One training iteration, as the engine saw it end."""

    iteration: int
    exposed_s: float  # from backward's last bucket to its last message done: comm not hidden
    tuner_s: float  # the iteration-end work (the tuner's bookkeeping and exchange)


@dataclass(frozen=True, slots=True)
class Summary:
    """Messages of one size class run by one algorithm."""

    count: int
    bytes: int
    median_s: float
    p99_s: float
    busbw_gbps: float  # at the median time, for the class's median message size
    #: On a compressed wire: the median of the sampled casts' relative errors (None: none).
    cast_error: float | None = None


def quartiles(values: Iterable[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile (inclusive method: defined for 2+ values)."""
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def summarize(records: Iterable[MessageRecord]) -> dict[tuple[int, str], Summary]:
    """Group ``records`` by (size class, algorithm) and summarize each group."""
    groups: dict[tuple[int, str], list[MessageRecord]] = {}
    for r in records:
        groups.setdefault((r.size_class, r.algorithm), []).append(r)
    out = {}
    for key in sorted(groups):
        group = groups[key]
        times = sorted(r.seconds for r in group)
        median = statistics.median(times)
        p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
        nbytes = statistics.median(r.nbytes for r in group)
        busbw = busbw_gbps(nbytes, median, group[0].world_size)
        errors = [r.cast_error for r in group if r.cast_error is not None]
        error = statistics.median(errors) if errors else None
        out[key] = Summary(len(group), sum(r.nbytes for r in group), median, p99, busbw, error)
    return out


class Recorder:
    """Keeps the most recent message and iteration records (an engine listener) and hook timings.

    Memory is bounded (``keep`` records of each kind).
    """

    def __init__(self, keep: int = 100_000) -> None:
        self._records: deque[MessageRecord] = deque(maxlen=keep)
        self._hook_calls: deque[tuple[float, float]] = deque(maxlen=keep)
        self._iterations: deque[IterationRecord] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def record(self, event: object) -> None:
        """An engine event: messages and iterations are kept, the rest ignored."""
        if isinstance(event, MessageRecord):
            with self._lock:
                self._records.append(event)
        elif isinstance(event, IterationRecord):
            with self._lock:
                self._iterations.append(event)

    def add_hook_call(self, started: float, seconds: float) -> None:
        with self._lock:
            self._hook_calls.append((started, seconds))

    def iterations(self) -> list[IterationRecord]:
        with self._lock:
            return list(self._iterations)

    def records(self) -> list[MessageRecord]:
        with self._lock:
            return list(self._records)

    def hook_calls(self) -> list[tuple[float, float]]:
        """Each hook call: when it started (time.perf_counter()) and seconds until it returned."""
        with self._lock:
            return list(self._hook_calls)

    def hook_times(self) -> list[float]:
        """Seconds from each hook call to its return (the autograd thread's cost per bucket)."""
        return [seconds for _, seconds in self.hook_calls()]
