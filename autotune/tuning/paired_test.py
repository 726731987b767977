"""Two plans compared on the training step, in interleaved iterations, with a stopping rule.

`PairedTest` runs the incumbent (A) and a challenger (B) in the order A B B A, A B B A, ... at
iteration ends, and pairs each iteration with its neighbour under the other arm; each pair gives
one ratio, B's step over A's. Drift moves both members of a pair alike and cancels.

Example::

    >>> test = PairedTest(max_pairs=24, warmup=2)
    >>> while test.outcome is None:
    ...     challenger = test.schedule()          # which arm the next iteration runs
    ...     test.measure(challenger, step_seconds)
    >>> test.outcome.challenger_won, test.outcome.gain

The stopping rule is the sign test inverted into a distribution-free interval for the median
ratio (`median_interval`), looked at every `LOOK_EVERY` pairs from `MIN_PAIRS` on: upper end
below 1, B wins; lower end above 1, B loses; from `FUTILE_FROM` pairs a median of 1 or more
loses; at ``max_pairs`` B loses, unless the test may be extended (``extend_to``) and its median
is at `PROMISING` or better. The burden of proof is on the challenger. ``signed_rank=True``
judges with Wilcoxon's signed-rank interval on the log ratios instead, for measurements that are
already medians of blocks (`autotune.tuning.blocks`). ``hold=True`` re-checks a challenger that
proved itself before: it keeps it while it stays ahead on the median. Why each rule, and the
odds they give: docs/TUNER.md, "The paired A/B test", and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autotune.plan import Gain

__all__ = [
    "FUTILE_FROM",
    "LOOK_EVERY",
    "MIN_PAIRS",
    "PROMISING",
    "SLOW_FACTOR",
    "PairedTest",
    "hodges_lehmann",
    "median_interval",
    "signed_rank_interval",
]

#: Pairs before the first look: below 6, no 95% interval excludes anything.
MIN_PAIRS = 6
#: Pairs between looks after the first.
LOOK_EVERY = 4
#: From this many pairs on, a challenger not ahead on the median stops (not a re-check's).
FUTILE_FROM = MIN_PAIRS + LOOK_EVERY
#: A pair whose challenger step is this many times the incumbent's ends the paired test at once: a
#: plan that slow is not worth more of the user's steps to measure.
SLOW_FACTOR = 3.0
#: A median ratio at least this far ahead at ``max_pairs`` earns an extendable paired test more
#: pairs: a 5% faster step, the gain worth having (issue 10's target where there is room for it).
PROMISING = 0.95
#: The intervals' confidence.
CONFIDENCE = 0.95


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of ``values`` (the sign test,
    inverted): the k-th smallest and k-th largest value, with k the largest count such that
    P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. With too few values for any such k, the
    interval is (0, inf): nothing can be excluded yet."""
    n = len(values)
    k = _critical((math.comb(n, j) for j in range(n)), n, confidence)
    if k == 0:
        return 0.0, math.inf
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def _critical(counts: Iterable[int], n: int, confidence: float) -> int:
    """The largest k with P(T < k) <= (1 - confidence) / 2, for a statistic T whose values
    0, 1, ... occur in ``counts[t]`` of the 2**n equally likely outcomes. Exact in integers: a
    float 2.0**n overflows from n = 1024 (a benchmark's 1300 paired steps)."""
    tail = (1.0 - confidence) / 2.0
    total, below = 2**n, 0  # below: outcomes with T < k + 1, accumulated term by term
    k = 0
    for count in counts:
        below += count
        if below / total > tail:
            break
        k += 1
    return k


def signed_rank_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """A confidence interval for the center of ``values``, symmetric about it (Wilcoxon's signed
    rank test, inverted): the k-th smallest and k-th largest of the Walsh averages (every
    (x_i + x_j) / 2, i <= j), with k the largest count such that P(T < k) <= (1 - confidence) / 2
    for the signed-rank statistic T of n values (its exact distribution, counted). Uses the
    values' sizes where the sign test uses only their signs, so it needs fewer of them to
    exclude a given gap; the price is the symmetry it assumes. (0, inf) where nothing can be
    excluded yet (fewer than 6 values at 95%)."""
    n = len(values)
    counts = [1]  # counts[t]: subsets of the ranks 1..r seen so far whose ranks sum to t
    for r in range(1, n + 1):
        grown = [*counts, *([0] * r)]
        for t, c in enumerate(counts):
            grown[t + r] += c
        counts = grown
    k = _critical(counts, n, confidence)
    if k == 0:
        return 0.0, math.inf
    walsh = sorted((values[i] + values[j]) / 2.0 for i in range(n) for j in range(i, n))
    return walsh[k - 1], walsh[len(walsh) - k]


def hodges_lehmann(values: Sequence[float]) -> float:
    """The center `signed_rank_interval` bounds: the median of the Walsh averages."""
    n = len(values)
    return statistics.median((values[i] + values[j]) / 2.0 for i in range(n) for j in range(i, n))


@dataclass(frozen=True)
class Outcome:
    """How a paired test ended: whether the challenger won, and its step over the incumbent's."""

    challenger_won: bool
    gain: Gain
    why: str

    def word(self, kind: str) -> str:
        """How it ended for the challenger, as the log says it: a re-check (``kind``) the locked
        plan does not prove but stays ahead in on the median is "held" (it stays locked; see
        `autotune.tuning.plan_search.PlanSearch`)."""
        if kind == "recheck" and not self.challenger_won:
            return "held" if self.gain.ratio < 1.0 else "lost"
        return "won" if self.challenger_won else "lost"


class PairedTest:
    """One paired comparison; feed it each iteration's step under either arm, in order.

    ``schedule()`` says which arm the next scheduled iteration runs (A B B A ...). `measure`
    takes the steps as they come back, labelled with the arm they ran under (measurements of
    iterations under neither arm are the caller's to drop). The first ``warmup`` steps of each
    arm are discarded: a newly chosen plan allocates its buffers and fills caches there.
    ``extend_to`` (at least ``max_pairs``; None: no extension) is how far a promising challenger
    may go on (see the module doc), ``promising`` the median ratio at or below which it does.
    ``hold``: a re-check of a challenger proven before, which
    wins at ``max_pairs`` if it is still ahead on the median, else is judged on the median again
    at ``extend_to`` (see the module doc). ``signed_rank``:
    judge the ratios' logarithms with `signed_rank_interval` (the ratio reported:
    `hodges_lehmann`'s, back from the logarithm) instead of the sign test; for measurements
    that are medians of several steps already (`autotune.tuning.buckets`' blocks), whose long tails
    the medians have cut off.
    """

    def __init__(
        self,
        max_pairs: int,
        warmup: int = 1,
        extend_to: int | None = None,
        signed_rank: bool = False,
        hold: bool = False,
        promising: float = PROMISING,
    ) -> None:
        if max_pairs < MIN_PAIRS:
            raise ValueError(f"a paired test needs at least {MIN_PAIRS} pairs, got {max_pairs}")
        if extend_to is not None and extend_to < max_pairs:
            raise ValueError(f"extend_to ({extend_to}) must be at least max_pairs ({max_pairs})")
        self.max_pairs = max_pairs
        self.extend_to = max_pairs if extend_to is None else extend_to
        self.signed_rank = signed_rank
        self.hold = hold
        self.promising = promising
        self.ratios: list[float] = []
        self._warmup = {False: warmup, True: warmup}  # by "is the challenger"
        self._unpaired: tuple[bool, float] | None = None
        self._scheduled = 0
        self.outcome: Outcome | None = None

    def schedule(self) -> bool:
        """Whether the next scheduled iteration runs the challenger (A B B A, repeated)."""
        challenger = self._scheduled % 4 in (1, 2)
        self._scheduled += 1
        return challenger

    def follow_on(self) -> None:
        """Go on in this order from iterations another order ran (`autotune.tuning.match`): the
        next `schedule` is the arm that completes a pair half measured, then A B B A from
        there."""
        self._scheduled = 0 if self._unpaired is None else 3 if self._unpaired[0] else 1

    def measure(self, challenger: bool, step_s: float) -> Outcome | None:
        """One iteration's step (MAX over ranks) under the challenger or the incumbent."""
        if self.outcome is not None:
            return self.outcome
        if self._warmup[challenger] > 0:
            self._warmup[challenger] -= 1
            return None
        if self._unpaired is None or self._unpaired[0] == challenger:
            self._unpaired = (challenger, step_s)  # a repeat replaces its older neighbour
            return None
        other = self._unpaired[1]
        self._unpaired = None
        ratio = step_s / other if challenger else other / step_s
        self.ratios.append(ratio)
        self.outcome = self._decide(ratio)
        return self.outcome

    def measurements_left(self) -> int:
        """Steps (one per iteration, or per block) this test still takes to ``max_pairs``, its
        warmup included: what a status estimates (a decision may come sooner, an extension
        later; 0 once decided)."""
        if self.outcome is not None:
            return 0
        limit = self.max_pairs if len(self.ratios) < self.max_pairs else self.extend_to
        pending = self._unpaired is not None  # half of the next pair is measured
        return 2 * max(0, limit - len(self.ratios)) - pending + sum(self._warmup.values())

    def gain(self) -> Gain:
        """The challenger's step over the incumbent's so far: median ratio and its interval."""
        if self.signed_rank:
            logs = [math.log(r) for r in self.ratios]
            low, high = signed_rank_interval(logs)
            low, high = (0.0, math.inf) if math.isinf(high) else (math.exp(low), math.exp(high))
            ratio = math.exp(hodges_lehmann(logs)) if logs else math.nan
            return Gain(ratio, low, high, len(self.ratios))
        low, high = median_interval(self.ratios)
        ratio = statistics.median(self.ratios) if self.ratios else math.nan
        return Gain(ratio, low, high, len(self.ratios))

    def _decide(self, latest: float) -> Outcome | None:
        n = len(self.ratios)
        if latest > SLOW_FACTOR:
            return Outcome(False, self.gain(), f"a step {latest:.1f}x the incumbent's")
        looks = (n - MIN_PAIRS) % LOOK_EVERY == 0 or n in (self.max_pairs, self.extend_to)
        if n < MIN_PAIRS or not looks:
            return None
        gain = self.gain()
        if gain.high < 1.0:
            return Outcome(True, gain, "faster beyond noise")
        if gain.low > 1.0:
            return Outcome(False, gain, "slower beyond noise")
        if self.hold:
            if n not in (self.max_pairs, self.extend_to):
                return None
            if gain.ratio < 1.0:
                return Outcome(True, gain, "ahead on the median")
            if n >= self.extend_to:
                return Outcome(False, gain, "not ahead on the median")
            return None
        if n >= FUTILE_FROM and gain.ratio >= 1.0:
            return Outcome(False, gain, "not ahead on the median")
        if n >= self.max_pairs and (n >= self.extend_to or gain.ratio > self.promising):
            return Outcome(False, gain, "not faster beyond noise")
        return None
