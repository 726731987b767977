"""Where autotune stands for one job, as one snapshot: `status` builds it from the tuner and the
unhooking, and `AutotuneState.locked`, `.verdict()`, the metrics and the framework loggers read it.

Example::

    >>> s = state.status()
    >>> s.locked, s.phase, s.verdict
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.plan import Buckets, Gain, NearMiss
from autotune.tuning.blocks import BLOCKS, blocks
from autotune.tuning.search import Progress
from autotune.util.units import count, format_bytes

if TYPE_CHECKING:
    from autotune.tuning.tuner import Tuner
    from autotune.tuning.unhooked import Unhooking

__all__ = [
    "Status",
    "status",
    "tuner_verdict",
]


@dataclass(frozen=True)
class Status:
    """A snapshot of where autotune stands, as this rank knows it.

    ``tuning``: a live tuner runs (False: a fixed plan). ``phase``: the tuner's phase as rank 0's
    orders said it (`autotune.tuning.wire.PHASES`; "fixed" without a tuner). ``plan_locked``:
    every rank knows the tuner's plan is locked (its exchanges are down to watching).
    ``settled``: the plan is locked and, where autotune unhooks, DDP's bucket size decided.
    ``locked``: the job runs a decided plan from here on (`AutotuneState.locked`). ``gain``: the
    plan's step over plain DDP's, once measured. ``states``: per size class, "exploring" or
    "locked". ``unhooked_at``: the iteration after which DDP runs without the hook (None: hooked).
    ``progress``: per size class (and "fusion"), the search's progress (rank 0; empty elsewhere).
    ``verdict``: one line for a job's summary. ``final``: the decision is this job's last word
    (`locked`, and no stage is left to run: the check against plain DDP and DDP's bucket-size
    search included); else it is provisional, ``to_run`` names the stages still to run, and
    ``iterations_left`` estimates the iterations those of them known now take (None: not known
    yet; `autotune.tuning.plan_search.PlanSearch.iterations_left`). The headline and the verdict
    read the same ``gain`` and ``final``.
    """

    tuning: bool
    phase: str
    plan_locked: bool
    settled: bool
    locked: bool
    gain: Gain | None
    unhooked_at: int | None
    verdict: str
    states: Mapping[int, str] = field(default_factory=dict)
    progress: Mapping[int | str, Progress] = field(default_factory=dict)
    final: bool = False
    to_run: tuple[str, ...] = ()
    iterations_left: int | None = None

    @property
    def decision(self) -> str:
        """``final``, ``provisional`` (still tuning), or ``fixed`` (a plan without the tuner)."""
        if not self.tuning:
            return "fixed"
        return "final" if self.final else "provisional"

    @property
    def headline(self) -> str:
        """The plain verdict, for the first line of a job's summary: faster with autotune, no
        gain (plain DDP kept, and whether autotune unhooked), or provisional (what is
        still to run). "faster" only once the decision is final and its paired test won."""
        if not self.tuning:
            return "a fixed plan: not compared with plain DDP"
        if not self.final:
            return f"provisional: {self.remaining()}"
        aside = (
            ""
            if self.unhooked_at is None
            else f"autotune unhooked after iteration {self.unhooked_at}"
        )
        if self.gain is not None and self.gain.ratio < 1:
            how = f" (DDP's own all-reduce in autotune's bucket size; {aside})" if aside else ""
            return f"{self.gain.ratio:.2f}x step time: faster with autotune{how}"
        if aside:
            return f"no gain: plain DDP kept, {aside}"
        return "no gain: plain DDP's all-reduce kept"

    def remaining(self) -> str:
        """While provisional: the gain so far, if one was measured, and what is still to run,
        with the estimate where there is one."""
        so_far = ""
        if self.gain is not None:
            so_far = f"{self.gain.ratio:.2f}x step time so far, not final; "
        stages = ", then ".join(self.to_run) or "tuning"
        left = self.iterations_left
        estimate = "" if left is None else f" (about {left} iterations for what is known now)"
        return f"{so_far}still to run: {stages}{estimate}"

    @property
    def compared(self) -> bool:
        """Whether the plan's step has been compared with the baseline's (a gain, or the
        baseline locked: 1.00x)."""
        return self.gain is not None or (self.plan_locked and self.phase == "locked")


def status(tuner: Tuner | None, unhooking: Unhooking | None) -> Status:
    """The snapshot, from what this rank knows now (settle the engine first for a reading that
    is the same on every rank after the same iteration)."""
    settled = _settled(tuner, unhooking)
    unhooked_at = None if unhooking is None else unhooking.at
    if tuner is None:
        return Status(
            tuning=False,
            phase="fixed",
            plan_locked=True,
            settled=settled,
            locked=settled,
            gain=None,
            unhooked_at=unhooked_at,
            verdict=_verdict(None, unhooking),
        )
    final = settled or (tuner.locked and tuner.unhook_from is None)
    to_run, left = ((), 0) if final else _still_to_run(tuner, unhooking)
    verdict = _verdict(tuner, unhooking)
    return Status(
        tuning=True,
        phase=tuner.phase,
        plan_locked=tuner.settled,
        settled=settled,
        locked=_locked(tuner, unhooking, settled),
        gain=_gain(tuner, unhooking),
        unhooked_at=unhooked_at,
        verdict=verdict if final else _provisional(verdict),
        states=dict(tuner.states),
        progress=tuner.progress(),
        final=final,
        to_run=to_run,
        iterations_left=left,
    )


def _provisional(verdict: str) -> str:
    """``verdict``, said to be provisional where it starts (still "autotune ...", as a log
    filter looks for)."""
    lead = "autotune vs plain DDP: "
    if verdict.startswith(lead):
        return f"autotune vs plain DDP, provisional: {verdict.removeprefix(lead)}"
    return f"provisional: {verdict}"


#: What each phase of the plan search runs, in the order they come (`PlanSearch`), then DDP's
#: bucket-size search once unhooked.
STAGES = {
    "loading": "loading what earlier jobs stored",
    "screening": "screening each message size's algorithms on latency",
    "classes": "paired tests of the shortlisted algorithms on the step",
    "fusion": "fusion sizes against the classes' winner on the step",
    "confirm": "the plan against the baseline on the step",
    "catch": "the check against plain DDP",
    "buckets": "DDP's bucket-size search",
}
#: The stages that may not come, and when they do, as said while they are still ahead.
_ONLY_IF = {"catch": " (if the plan needs the hook)", "buckets": " (if plain DDP is kept)"}


def _still_to_run(tuner: Tuner, unhooking: Unhooking | None) -> tuple[tuple[str, ...], int | None]:
    """The stages still to run, and the estimate of the iterations those known now take."""
    if unhooking is not None:
        check = unhooking.catch
        if tuner.check_from is not None and check is not None and not check.over:
            return (STAGES["catch"],), check.iterations_left()
        if unhooking.at is not None and unhooking.buckets is not None:
            return (STAGES["buckets"],), unhooking.buckets.iterations_left()
        if tuner.unhook_from is not None and unhooking.refused is None:
            return ("unhooking for plain DDP at the next forward", STAGES["buckets"]), None
    if tuner.phase == "locked":  # the orders that lock it are on their way to every rank
        return ("settling the locked plan on every rank",), 0
    order = list(STAGES)
    ahead = order[order.index(tuner.phase) :] if tuner.phase in order else order
    only_if = dict(_ONLY_IF)
    if not tuner.unhooks:
        ahead = [a for a in ahead if a not in ("catch", "buckets")]
    elif tuner.phase != "confirm":
        # A plan that needs the hook meets plain DDP instead (`PlanSearch`): the same test
        # against a stronger baseline.
        only_if["confirm"] = " (if the plan needs no hook)"
    if tuner.phase == "loading":
        ahead = ahead[:1]
    return tuple(STAGES[a] + only_if.get(a, "") for a in ahead), tuner.to_go


def _gain(tuner: Tuner, unhooking: Unhooking | None) -> Gain | None:
    """The gain the headline and the verdict both read: DDP's bucket size's once its search has
    decided, else rank 0's plan search's (the latest), else what rank 0's orders carried."""
    if unhooking is not None and unhooking.buckets is not None and unhooking.buckets.done:
        return tuner.gain
    if tuner.decider is not None:
        return tuner.decider.plan_search.gain
    return tuner.gain


def _settled(tuner: Tuner | None, unhooking: Unhooking | None) -> bool:
    """`Status.settled`."""
    if tuner is None:
        return unhooking is None or unhooking.at is not None or unhooking.refused is not None
    if not tuner.settled or tuner.check_from is not None:
        return False
    if unhooking is None or unhooking.refused is not None or tuner.unhook_from is None:
        return True
    if unhooking.at is None:
        return False  # unhooks before the next forward
    return unhooking.buckets is None or unhooking.buckets.done


def _locked(tuner: Tuner | None, unhooking: Unhooking | None, settled: bool) -> bool:
    """`Status.locked`: ``settled`` (`_settled`'s answer), or re-checking the locked plan
    against the baseline; where autotune unhooks, ``settled``. Reads what rank 0 broadcast, so
    the same on every rank after the same iteration."""
    if tuner is None:
        return settled
    if tuner.unhook_from is None:
        return tuner.locked
    if unhooking is not None and unhooking.at is None and unhooking.refused is None:
        return True  # the baseline, locked: DDP takes over at the next forward
    return settled


def _verdict(tuner: Tuner | None, unhooking: Unhooking | None) -> str:
    """The job's training step against plain DDP's, as the tuner measured it (on rank 0, which
    decides), and whether autotune unhooked."""
    if tuner is None:
        line = "autotune vs plain DDP: not compared (a fixed plan runs without the tuner)"
        if unhooking is not None and unhooking.at is not None:
            line += (
                f"; autotune unhooked after iteration {unhooking.at}: DDP runs its own "
                "all-reduce in the plan file's buckets, without the hook"
            )
        return line
    if unhooking is None or unhooking.at is None:
        return tuner_verdict(tuner)
    after = (
        f"autotune unhooked after iteration {unhooking.at}: DDP runs its own all-reduce, "
        "without the hook"
    )
    if unhooking.buckets is None:
        return f"{tuner_verdict(tuner)}; {after}"
    search = unhooking.buckets.search
    if search is None or not unhooking.buckets.done:
        pairs = 0 if search is None else search.pairs
        return (
            f"{tuner_verdict(tuner)}; {after}, and compares bucket sizes on it "
            f"({count(pairs, 'pair')} of blocks so far)"
        )
    kept = search.result()
    assert kept is not None
    if kept.gain is None:
        if search.history:
            why = f"no bucket size beat them over {count(search.pairs, 'pair')} of blocks"
        elif search.as_stored:
            why = "as the stored plan says"
        else:  # nothing stored, and no neighbouring size changes the layout (`challengers`)
            why = "no neighbouring bucket size makes other buckets of them"
        why += _again(kept.lead) + _again(_plan_lead(tuner))
        return (
            "autotune vs plain DDP: 1.00x step time (DDP's own all-reduce on the job's "
            f"buckets: {why}); {after}"
        )
    buckets = f"DDP's own all-reduce in {format_bytes(kept.bucket_bytes)} buckets"
    return f"{kept.gain.verdict(BLOCKS, buckets + _again(_plan_lead(tuner)))}; {after}"


def _again(lead: NearMiss | Buckets | None) -> str:
    """What the verdict adds for a lead the next job tests once more."""
    return "" if lead is None else f"; the next job gives {lead.describe()} one more paired test"


def _plan_lead(tuner: Tuner) -> NearMiss | None:
    """The plan search's lead, where the baseline is kept (rank 0 knows it)."""
    return None if tuner.decider is None else tuner.decider.plan_search.lead


def tuner_verdict(tuner: Tuner) -> str:
    """One line: the tuner's plan's training step against plain DDP's, as measured (rank 0)."""
    decider = tuner.decider
    if decider is None:
        return "autotune vs plain DDP: measured on rank 0"
    plan_search = decider.plan_search
    if decider.storage_error is not None:
        return (
            f"autotune vs plain DDP: not compared further (tuning stopped: the tuning "
            f"storage failed, {decider.storage_error}); the plan kept: "
            f"{plan_search.incumbent.describe()}"
        )
    if plan_search.baseline_kept and plan_search.history and plan_search.history[-1][0] == "catch":
        _, plan, outcome = plan_search.history[-1]
        return (
            "autotune vs plain DDP: 1.00x step time (DDP's own all-reduce kept: "
            f"{plan.describe()} beat it through the hook, but ran "
            f"{outcome.gain.over(blocks(plan_search.check_steps))} against plain DDP"
            f"{_again(plan_search.lead)})"
        )
    if plan_search.baseline_kept:
        pairs = sum(o.gain.pairs for kind, _, o in plan_search.history if kind != "catch")
        if not pairs:
            why = (
                "as the stored plan says"
                if plan_search.stored == plan_search.baseline
                else "no plan was put forward against it"
            )
            return f"autotune vs plain DDP: 1.00x step time (DDP's own all-reduce kept, {why})"
        return (
            "autotune vs plain DDP: 1.00x step time (DDP's own all-reduce kept: no plan "
            f"beat it over {count(pairs, 'pair')} of iterations{_again(plan_search.lead)})"
        )
    gain = plan_search.gain
    if gain is None:
        return f"autotune vs plain DDP: not compared yet (tuning: {plan_search.phase})"
    what = f"plan: {plan_search.incumbent.describe()}"
    if not plan_search.against_plain:
        # Not the check's: the paired tests run DDP's all-reduce through the hook, which costs
        # the hook's calls. It read as a gain over plain DDP that the check then did not find.
        what += "; against DDP's all-reduce through autotune's hook"
    unit = blocks(plan_search.check_steps) if plan_search.against_plain else "iterations"
    return gain.verdict(unit, what)
