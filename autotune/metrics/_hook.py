"""The hook's series: per message, per iteration, the plan and the tuner, for one rank.

`HookMetrics` listens to the engine's events and keeps running totals in plain dicts (a message
costs a few dictionary updates); `collect` turns them into fresh metric families at each scrape.
"""

from __future__ import annotations

import bisect
import math
import statistics
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from autotune.algorithms import split_label
from autotune.ddp.stats import IterationRecord, MessageRecord
from autotune.tuning.status import Status, status
from autotune.tuning.wire import PHASES

if TYPE_CHECKING:
    from autotune.ddp.engine import Engine
    from autotune.tuning import Tuner
    from autotune.tuning.unhooked import Unhooking

__all__ = ["LATENCY_BUCKETS_S", "HookMetrics", "step_ratio_series"]

#: Histogram buckets for latencies, in seconds: 50 us to 10 s.
LATENCY_BUCKETS_S = (
    5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
)  # fmt: skip
#: Recent messages a bus-bandwidth gauge takes the median of.
BUSBW_WINDOW = 16


_UNHOOKED_HELP = (
    "1 once autotune has taken its hook out of DDP (no plan beat the baseline: DDP runs its own "
    "all-reduce, and the message series stop), else 0."
)
#: The unhooked gauge, under its name and, for one release, its old one (docs/METRICS.md).
UNHOOKED_SERIES = {
    "autotune_hook_unhooked": _UNHOOKED_HELP,
    "autotune_hook_stepped_aside": "Deprecated, goes in the next release: autotune_hook_unhooked. "
    + _UNHOOKED_HELP,
}


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*LATENCY_BUCKETS_S, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


@dataclass
class _Messages:
    latency: _Histogram = field(default_factory=_Histogram)
    bytes: int = 0
    sent_bytes: int = 0
    busbw: deque[float] = field(default_factory=lambda: deque(maxlen=BUSBW_WINDOW))


class HookMetrics(Collector):
    """Series for one engine (and its tuner, if any), labelled with ``labels`` (the rank, ...)."""

    def __init__(
        self,
        engine: Engine,
        tuner: Tuner | None,
        labels: Mapping[str, str],
        unhooking: Unhooking | None = None,
    ) -> None:
        self.engine = engine
        self.tuner = tuner
        self.unhooking = unhooking
        self.labels = dict(labels)
        self._messages: dict[tuple[int, str], _Messages] = {}
        #: (size class, wire) -> the latest sampled casts' relative errors.
        self._cast_errors: dict[tuple[int, str], deque[float]] = {}
        self._first_wait = _Histogram()
        self._peer_wait = _Histogram()
        self._exposed = _Histogram()
        self._lock = threading.Lock()
        engine.subscribe(self.record)

    def record(self, event: object) -> None:
        """An engine event, on its finishing thread: it must stay cheap."""
        if isinstance(event, MessageRecord):
            self._message(event)
        elif isinstance(event, IterationRecord):
            with self._lock:
                self._exposed.observe(event.exposed_s)

    def _message(self, r: MessageRecord) -> None:
        with self._lock:
            m = self._messages.get((r.size_class, r.algorithm))
            if m is None:
                m = self._messages[(r.size_class, r.algorithm)] = _Messages()
            m.latency.observe(r.seconds)
            m.bytes += r.nbytes
            m.sent_bytes += r.sent_bytes or 0
            m.busbw.append(r.busbw_gbps * 1e9)
            if r.first_wait_s is not None:
                self._first_wait.observe(r.first_wait_s)
            if r.wait_s is not None:
                self._peer_wait.observe(r.wait_s)
            if r.cast_error is not None:  # on a compressed wire: "ring+bf16"
                wire = split_label(r.algorithm)[1]
                assert wire is not None
                key = (r.size_class, wire)
                errors = self._cast_errors.get(key)
                if errors is None:
                    errors = self._cast_errors[key] = deque(maxlen=BUSBW_WINDOW)
                errors.append(r.cast_error)

    def collect(self) -> Iterator[Metric]:
        names, values = list(self.labels), list(self.labels.values())
        per = [*names, "size_class", "algorithm"]
        latency = HistogramMetricFamily(
            "autotune_allreduce_latency_seconds",
            "All-reduce time per message, by message-size class (bytes) and algorithm.",
            labels=per,
        )
        nbytes = CounterMetricFamily(
            "autotune_allreduce_bytes",
            "Bytes all-reduced (message sizes), by size class and algorithm.",
            labels=per,
        )
        sent = CounterMetricFamily(
            "autotune_p2p_sent_bytes",
            "Bytes this rank sent for point-to-point algorithms (not counted for native).",
            labels=per,
        )
        busbw = GaugeMetricFamily(
            "autotune_allreduce_busbw_bytes_per_second",
            f"Bus bandwidth (algbw * 2(n-1)/n), median of the last {BUSBW_WINDOW} messages.",
            labels=per,
        )
        with self._lock:
            for (cls, algo), m in sorted(self._messages.items()):
                key = [*values, str(cls), algo]
                latency.add_metric(key, m.latency.buckets(), m.latency.total)
                nbytes.add_metric(key, m.bytes)
                sent.add_metric(key, m.sent_bytes)
                busbw.add_metric(key, statistics.median(m.busbw))
            cast = {key: statistics.median(e) for key, e in sorted(self._cast_errors.items())}
            first_wait = (self._first_wait.buckets(), self._first_wait.total)
            peer_wait = (self._peer_wait.buckets(), self._peer_wait.total)
            exposed = (self._exposed.buckets(), self._exposed.total)
        yield from (latency, nbytes, sent, busbw)
        error = GaugeMetricFamily(
            "autotune_compression_relative_error",
            "On a compressed wire (Config.compression), the relative error the cast adds to "
            f"this rank's gradients, ||g - cast(g)|| / ||g||: median of the last {BUSBW_WINDOW} "
            "sampled messages, by size class and wire dtype.",
            labels=[*names, "size_class", "wire"],
        )
        for (cls, wire), value in cast.items():
            error.add_metric([*values, str(cls), wire], value)
        yield error
        wait = HistogramMetricFamily(
            "autotune_first_peer_wait_seconds",
            "Time a message waited for the first peer's data: long when a peer is late.",
            labels=names,
        )
        wait.add_metric(values, *first_wait)
        yield wait
        blocked = HistogramMetricFamily(
            "autotune_peer_wait_seconds",
            "Time a message kept this rank blocked on its peers in all (receives, barriers); "
            "the rest of its time is its own copies and sums. Not observable for native.",
            labels=names,
        )
        blocked.add_metric(values, *peer_wait)
        yield blocked
        hidden = HistogramMetricFamily(
            "autotune_exposed_communication_seconds",
            "Per iteration, communication not hidden by backward: from its last bucket to its "
            "last message done.",
            labels=names,
        )
        hidden.add_metric(values, *exposed)
        yield hidden
        yield from self._plan(names, values)
        if self.tuner is not None:
            yield from self._tuner(names, values)

    def _plan(self, names: list[str], values: list[str]) -> Iterator[Metric]:
        plan = GaugeMetricFamily(
            "autotune_plan_info",
            "The choice for each message-size class seen: 1 for the algorithm and segment in use.",
            labels=[*names, "size_class", "algorithm", "segment_bytes"],
        )
        for cls, choice in self.engine.plan.table().items():
            seg = "default" if choice.segment_bytes is None else str(choice.segment_bytes)
            plan.add_metric([*values, str(cls), choice.label, seg], 1)
        yield plan
        fusion = GaugeMetricFamily(
            "autotune_fusion_bytes",
            "The message size buckets are fused or split to (0: DDP's buckets as they are).",
            labels=names,
        )
        fusion.add_metric(values, self.engine.fusion_bytes)
        yield fusion

    def _tuner(self, names: list[str], values: list[str]) -> Iterator[Metric]:
        now = status(self.tuner, self.unhooking)
        state = GaugeMetricFamily(
            "autotune_tuner_state",
            "Per size class, 1 for the tuner's state (exploring or locked), 0 for the other.",
            labels=[*names, "size_class", "state"],
        )
        for cls, was in sorted(now.states.items()):
            for s in ("exploring", "locked"):
                state.add_metric([*values, str(cls), s], 1 if was == s else 0)
        yield state
        settled = GaugeMetricFamily(
            "autotune_tuner_settled",
            "1 once every size class (and the fusion size) is locked, else 0.",
            labels=names,
        )
        settled.add_metric(values, 1 if now.plan_locked else 0)
        yield settled
        phase = GaugeMetricFamily(
            "autotune_tuner_phase",
            "1 for the tuner's phase (loading, screening, classes, fusion, confirm, catch, "
            "locked), 0 for the others.",
            labels=[*names, "phase"],
        )
        for name in PHASES:
            phase.add_metric([*values, name], 1 if now.phase == name else 0)
        yield phase
        yield from step_ratio_series(now, names, values)
        unhooked = 1 if now.unhooked_at is not None else 0
        for name, help_text in UNHOOKED_SERIES.items():
            gauge = GaugeMetricFamily(name, help_text, labels=names)
            gauge.add_metric(values, unhooked)
            yield gauge
        progress = now.progress  # rank 0's knowledge; empty elsewhere
        if not progress:
            return
        trials = CounterMetricFamily(
            "autotune_tuner_trials",
            "Trials the tuner ran in this job, by size class (or 'fusion').",
            labels=[*names, "size_class"],
        )
        best = GaugeMetricFamily(
            "autotune_tuner_best_latency_seconds",
            "Latency of the best trial so far (for 'fusion': exposed communication).",
            labels=[*names, "size_class"],
        )
        for key, p in progress.items():
            trials.add_metric([*values, str(key)], p.trials_total)
            if p.best_s is not None:
                best.add_metric([*values, str(key)], p.best_s)
        yield trials
        yield best


def step_ratio_series(now: Status, names: list[str], values: list[str]) -> Iterator[Metric]:
    """The plan's step over the baseline's, as every rank heard it from rank 0 (below 1:
    faster), and whether that is final; the speedup series, its inverse, for one release."""
    decided = GaugeMetricFamily(
        "autotune_step_ratio_final",
        "1 once autotune's decision is final (the plan locked, its check against plain DDP "
        "and DDP's bucket-size search over), 0 while it is provisional.",
        labels=names,
    )
    decided.add_metric(values, 1 if now.final else 0)
    yield decided
    left = now.iterations_left
    if left is not None:
        togo = GaugeMetricFamily(
            "autotune_tuner_iterations_left",
            "Iterations the stages of tuning known now still take, as estimated (0: final).",
            labels=names,
        )
        togo.add_metric(values, left)
        yield togo
    gain = now.gain
    if not now.compared:
        return  # not compared yet
    estimate, low, high = (1.0, 1.0, 1.0) if gain is None else (gain.ratio, gain.low, gain.high)
    pairs = 0 if gain is None else gain.pairs
    ratio = GaugeMetricFamily(
        "autotune_step_ratio",
        "autotune's training step over plain DDP's (below 1: faster), from paired iterations "
        "against the baseline (the backend's own all-reduce on DDP's buckets), or paired "
        "blocks against plain DDP itself once a plan that needs the hook passed that check, "
        "or once autotune unhooked onto a DDP bucket size of its choosing: 'estimate' "
        "(median) and the 95% interval's 'low' and 'high' ends; 1 while the baseline runs. "
        "Provisional until autotune_step_ratio_final is 1.",
        labels=[*names, "bound"],
    )
    ratio.add_metric([*values, "estimate"], estimate)
    ratio.add_metric([*values, "low"], low)
    if math.isfinite(high):
        ratio.add_metric([*values, "high"], high)
    yield ratio
    counted = GaugeMetricFamily(
        "autotune_step_ratio_pairs",
        "Pairs (of iterations, or of blocks) behind autotune_step_ratio (0: the baseline).",
        labels=names,
    )
    counted.add_metric(values, pairs)
    yield counted
    # Deprecated for one release: the same figure inverted (above 1 faster).
    speedup = GaugeMetricFamily(
        "autotune_step_speedup_ratio",
        "Deprecated, removed in the next release: 1 / autotune_step_ratio (above 1 faster).",
        labels=[*names, "bound"],
    )
    speedup.add_metric([*values, "estimate"], 1.0 / estimate)
    speedup.add_metric([*values, "low"], 0.0 if math.isinf(high) else 1.0 / high)
    if low > 0:
        speedup.add_metric([*values, "high"], 1.0 / low)
    yield speedup
    old_pairs = GaugeMetricFamily(
        "autotune_step_speedup_pairs",
        "Deprecated, removed in the next release: autotune_step_ratio_pairs.",
        labels=names,
    )
    old_pairs.add_metric(values, pairs)
    yield old_pairs
