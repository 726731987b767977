"""A size class's screening: its algorithm x segment searched live on rank 0, as readable study
parameters, on the latency of its messages (`autotune.tuning.search.Search`). What it finds only
shortlists a challenger (`autotune.tuning.plan_search`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.plan import Choice
from autotune.tuning.search import Host, Search
from autotune.tuning.space import choice_of, params_of, suggest_choice, wires_of

if TYPE_CHECKING:
    import optuna

__all__ = ["SEGMENTS_WITHIN", "WIRE_SHORTLIST", "ClassSearch"]

#: An algorithm's other segment sizes are screened only where one of its choices screened within
#: this many times the class's fastest (`ClassSearch`). A segment size moved an algorithm's latency
#: by up to 1.6x in the screenings logged (the example's MLP, 2 MiB class: two_tree 6.18 ms, at 1
#: MiB segments 3.84 ms), and only a choice within 1.1x of the fastest is shortlisted
#: (`autotune.tuning.shortlist.RUNNER_UP_WITHIN`): beyond 2x, no segment size brings it there.
SEGMENTS_WITHIN = 2.0
#: Where a job allows compression (`Config.compression`), each wire dtype is screened on this
#: many of the fastest uncompressed choices of a class, after them (`ClassSearch`).
WIRE_SHORTLIST = 3


class ClassSearch(Search[Choice]):
    """Algorithm x segment for one size class, as readable study parameters.

    ``universe`` is every choice the class has (None: ``space``): trials are written over it,
    so a study's parameters keep the same choices whichever job asks (Optuna refuses a
    parameter whose choices change). ``space`` is what this job tries, in order: a prior
    (`autotune.model.Prior`) may order it and leave some out.

    A segment size refines an algorithm that is in the race: the job's choice is screened first,
    then each algorithm once, unsegmented (at its largest segment, where the class is larger
    than its default segment; at its first, where a prior ordered the space: ``ranked``), then
    the other segment sizes of an algorithm only where one of its choices screened within
    `SEGMENTS_WITHIN` of the class's fastest, closest first (docs/TUNER.md, "Screening").

    Where the space has compressed choices (`Choice.wire`), the uncompressed ones are screened
    first, up to `Config.tune_trials` of them; then each wire dtype on the `WIRE_SHORTLIST`
    fastest of those (one failed as too slow counts, behind every one with a value). A wire
    halves the bytes of every choice alike, so it is tried where the schedule already pays, and
    it adds a few trials a wire rather than doubling the space.
    """

    def __init__(
        self,
        tuner: Host,
        what: str,
        space: list[Choice],
        default: Choice,
        universe: list[Choice] | None = None,
        ranked: bool = False,
    ) -> None:
        super().__init__(tuner, what, space, default)
        self.universe = list(space) if universe is None else universe
        #: Whether ``space`` is in an order of preference (a prior's): an algorithm's lead is
        #: then its first choice there.
        self.ranked = ranked

    def option_of(self, params: dict[str, Any]) -> Choice | None:
        return choice_of(params, self.universe)

    def params_of(self, option: Choice) -> dict[str, Any]:
        return params_of(option, wired=any(c.wire is not None for c in self.universe))

    def suggest(self, trial: optuna.Trial) -> Choice:
        return suggest_choice(trial, self.universe)

    def _to_try(self, measured: set[Choice], values: Mapping[Choice, float]) -> list[Choice]:
        order = self._order()
        uncompressed = [o for o in order if o.wire is None]
        fresh = [o for o in self._raced(uncompressed, values) if o not in measured]
        wires = wires_of(self.space)
        if not wires:
            return [] if self.finished >= self.tuner.config.tune_trials else fresh
        if self.finished >= self._budget():
            return []
        first = [o for o in order[:1] if o not in measured]  # the job's choice, compressed or not
        if fresh and sum(o in measured for o in uncompressed) < self.tuner.config.tune_trials:
            return list(dict.fromkeys(first + fresh))
        # A choice failed as too slow ranks after every one with a value: the shortlist is
        # the fastest few screened, and one noisy window must not keep a choice off it.
        fastest = sorted((o for o in uncompressed if o in values), key=values.__getitem__) + sorted(
            (o for o in uncompressed if o not in values and o in self.slow),
            key=self.slow.__getitem__,
        )
        twins = [
            Choice(c.algorithm, c.segment_bytes, w) for w in wires for c in fastest[:WIRE_SHORTLIST]
        ]
        return list(dict.fromkeys(first + [t for t in twins if t in order and t not in measured]))

    def _raced(self, plain: list[Choice], values: Mapping[Choice, float]) -> list[Choice]:
        """``plain`` (uncompressed, in the space's order) in the order screened, without the
        segment sizes out of the race: its first (the job's choice), each algorithm's lead (its
        first where the space is `ranked`, else its unsegmented run, else its largest segment),
        then the other segment sizes of each algorithm none of whose choices has screened yet or
        one has within `SEGMENTS_WITHIN` of the fastest (``values``, or a window that failed it
        as too slow), closest first."""
        lead: dict[str, Choice] = {}
        for c in plain:
            held = lead.get(c.algorithm)
            if held is None or (not self.ranked and c.span > held.span):
                lead[c.algorithm] = c
        leads = [c for c in plain[1:] if lead[c.algorithm] == c]
        others = [c for c in plain[1:] if lead[c.algorithm] != c]
        best = min(values.values(), default=math.inf)
        standing: dict[str, float] = {}
        for c in plain:
            seen = values.get(c, self.slow.get(c))
            if seen is not None:
                standing[c.algorithm] = min(seen, standing.get(c.algorithm, math.inf))
        racing = [c for c in others if standing.get(c.algorithm, 0.0) <= SEGMENTS_WITHIN * best]
        racing.sort(key=lambda c: standing.get(c.algorithm, math.inf))
        return plain[:1] + leads + racing

    def _budget(self) -> int:
        wires = wires_of(self.space)
        plain = min(self.tuner.config.tune_trials, sum(c.wire is None for c in self.space))
        return plain + min(WIRE_SHORTLIST, plain) * len(wires)
