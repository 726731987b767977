"""Rank 0's search over whole plans, judged on the training step against the baseline.

A plan (`Arm`) is a choice per size class and a fusion size. The baseline is the backend's own
all-reduce on DDP's own buckets. `PlanSearch` starts from it and moves only to a plan that won a
paired test against the plan it runs (`autotune.tuning.paired_test`), through the phases:
``screening`` (per class, on message latency, which only shortlists:
`autotune.tuning.shortlist`), ``classes`` (the classes' fastest choices together, then each
shortlisted choice that plan does not run, near misses of several classes together),
``fusion`` (each fusion size, the classes it makes taking the choices of the incumbent's
nearest classes, two at once sharing the incumbent's iterations: `autotune.tuning.match`; one
that came close, again with screening's: `autotune.tuning.fusion_stage`),
``confirm`` (against the baseline), ``catch`` (a plan that needs the hook against plain DDP
itself, `autotune.tuning.plain_check`) and ``locked`` (re-checked against the baseline every
``recheck_every`` iterations; one that lost starts a new round). A job from a stored plan goes
to ``confirm`` (or ``catch``); one that resumes a job that ended undecided, to ``screening``
(`PlanSearch.resume`). A round that keeps the baseline remembers its near miss
(`autotune.plan.NearMiss`), or where the check against plain DDP lost, the plan the checked one
beat, or the checked one if it came close (`PlanSearch.caught`): the next job tests it once more.
The check runs in blocks of 1 timed step where the plan's gain is clear, else 4
(`autotune.tuning.blocks.check_steps_for`).

The tuner drives it once per iteration end::

    >>> search.start(stored_arm, near_miss)   # or start(None, None) on an empty storage
    >>> arm = search.next_arm(screening_arm)  # what the next iteration runs
    >>> search.measure(arm, step_seconds)
    >>> search.tick(iteration)

The phases, as a diagram, and why each exists: docs/TUNER.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autotune.plan import BASELINE_CHOICE, Arm, Choice, Gain, NearMiss
from autotune.tuning.blocks import BLOCK_STEPS, check_steps_for
from autotune.tuning.fusion_stage import FusionStage
from autotune.tuning.match import Match, Rival
from autotune.tuning.paired_test import FUTILE_FROM, LOOK_EVERY, MIN_PAIRS, Outcome, PairedTest

__all__ = [
    "NEAR_MISS_BELOW",
    "PlanSearch",
]

#: A paired test against the baseline whose challenger lost with a median ratio below this (ahead by
#: 3% or more, not beyond noise) makes it a lead for the next job, if the round keeps the
#: baseline. Challengers with nothing to gain end just under 1.00, which this bar leaves out;
#: a lead that is only noise costs the next job one paired test.
NEAR_MISS_BELOW = 0.97
#: Pairs in a re-check of a locked plan against the baseline.
RECHECK_PAIRS = MIN_PAIRS + LOOK_EVERY


class PlanSearch:
    """The plan-level state machine; rank 0 drives it once per exchange (see the module doc)."""

    def __init__(
        self,
        baseline: Arm,
        *,
        fusion_options: Sequence[int],
        max_pairs: int,
        warmup: int,
        recheck_every: int,
        catch: bool = False,
        needs_hook: Callable[[Arm], bool] | None = None,
        messages: Callable[[int], list[int]] | None = None,
        space: Callable[[int], Sequence[Choice]] | None = None,
    ) -> None:
        self.baseline = baseline
        #: Whether a plan that needs the hook meets plain DDP before it is locked (the job
        #: unhooks for the baseline; `autotune.tuning.plain_check`).
        self.catch = catch
        #: Whether a plan needs the hook (default: any plan that is not the baseline's choices);
        #: one that does not (autotune-nccl's cells, which NCCL runs from a table once autotune
        #: unhooks: `autotune.algorithms.carried`) is locked without the check.
        self.needs_hook = needs_hook or (lambda arm: bool(arm.choices))
        #: The fusion sizes, after the class tests (``messages``, ``space``: `FusionStage`'s).
        self.fusion = FusionStage(
            [f for f in fusion_options if f != baseline.fusion_bytes],
            messages or (lambda fusion: []),
            space,
        )
        #: Whether ``gain`` is the check's: against plain DDP itself, in pairs of blocks.
        self.against_plain = False
        self.incumbent = baseline
        self.max_pairs = max_pairs
        self.warmup = warmup
        self.recheck_every = recheck_every
        self.phase = "loading"
        self.match: Match | None = None
        #: The incumbent's step over the baseline's, from the last paired test between them (None:
        #: the incumbent is the baseline, or they have not met since it changed).
        self.gain: Gain | None = None
        #: The incumbent's step over the baseline's as its paired tests measured it: the median of
        #: the last one against the baseline, times each later win's (None: the baseline, or not
        #: known). What the check's block size goes by (`check_steps_for`), not a reported gain.
        self.estimate: float | None = None
        #: Timed steps per block of the check against plain DDP, once the plan goes to it.
        self.check_steps = BLOCK_STEPS
        self.round = 0
        #: Every finished paired test: (kind, challenger, outcome), oldest first.
        self.history: list[tuple[str, Arm, Outcome]] = []
        self._queue: list[tuple[int, Choice]] = []  # the class paired tests to come
        #: The class paired test under way: (class, choice).
        self._trying: tuple[int, Choice] | None = None
        #: Per class, its best challenger this round that was ahead on the median and lost:
        #: (choice, median ratio). They meet the incumbent together once (a combined paired test).
        self._near: dict[int, tuple[Choice, float]] = {}
        self._locked_at: int | None = None  # the first exchange's iteration once locked
        self._second_look = False  # the re-check under way is a failed one's second look
        #: The plan a previous job stored, as `start` was given it.
        self.stored: Arm | None = None
        #: This round's closest challenger against the baseline (see the module doc).
        self._lead: NearMiss | None = None
        #: This round's last incumbent that had beaten the baseline and then lost to a challenger:
        #: the next job's lead should the plan that beat it lose the check against plain DDP.
        self._beaten: NearMiss | None = None
        #: Whether this round searched (screening on): only such a round leaves a lead after a
        #: lost check, so a stored plan or lead gets one more test, not one per job.
        self._searched = False
        #: Per class, screening's fastest choice this round (the shortlist's first).
        self._screened: dict[int, Choice] = {}
        self._joint_arm: Arm | None = None  # this round's classes' fastest together (`_joint`)

    # -- what rank 0 asks ----------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """Locked, and nothing being compared."""
        return self.phase == "locked" and self.match is None

    @property
    def rechecking(self) -> bool:
        """Locked, and the locked plan meeting the baseline again (it stays locked if it wins)."""
        return self.match is not None and self.match.kind == "recheck"

    @property
    def steady(self) -> bool:
        """Nothing is compared in the tuner's windows: locked and settled, or in the check against
        plain DDP (which compares blocks of iterations on DDP's reducers, outside them)."""
        return self.settled or self.phase == "catch"

    @property
    def baseline_kept(self) -> bool:
        return self.phase == "locked" and self.incumbent == self.baseline

    @property
    def lead(self) -> NearMiss | None:
        """Where the baseline is kept: the plan for the next job to try again, if one came
        close (`NEAR_MISS_BELOW`)."""
        return self._lead if self.baseline_kept else None

    @property
    def fusion_near(self) -> NearMiss | None:
        """This round's fusion size that came close, until its second meeting has ended: what
        a job that ends undecided stores for the next to meet again (`resume`)."""
        return self.fusion.near

    @property
    def fused(self) -> bool:
        """Whether this round's fusion sizes have all met the incumbent (or none is tuned)."""
        return self.fusion.done

    @property
    def fusion_left(self) -> list[int]:
        """This round's fusion sizes still to meet the incumbent: what a job that ends
        undecided stores for the next to meet (`resume`)."""
        return self.fusion.left

    def iterations_left(self, screening: int | None) -> int | None:
        """A rough count of the iterations before the plan is locked (or meets plain DDP): the
        paired test under way to its ``max_pairs``, each one queued at `FUTILE_FROM` pairs (where
        a challenger that is not ahead stops; the fusion sizes two at a time, three iterations
        for a pair of each), and where screening is still to come or under way, its windows left
        (``screening``; None: not known yet, and so is this). Stages not known yet (the paired
        tests screening will put forward) are not in it: a status says which stages remain
        beside it. 0 once settled; None while loading."""
        if self.phase == "loading":
            return None
        n = 0 if self.match is None else self.match.measurements_left()
        each, fused = FUTILE_FROM + self.warmup, len(self.fusion.pending)  # an arm's, to the stop
        n += len(self._queue) * 2 * each + (fused // 2) * 3 * each + (fused % 2) * 2 * each
        if self.phase == "screening":
            if screening is None:
                return None
            n += screening
        return n

    def duels(self, kind: str) -> int:
        return sum(1 for k, _, _ in self.history if k == kind)

    def next_arm(self, screening: Arm | None = None) -> Arm:
        """The plan the next scheduled iteration runs (``screening``: while classes screen)."""
        if self.match is not None:
            return self.match.next_arm()
        if self.phase == "screening" and screening is not None:
            return screening
        return self.incumbent

    # -- what rank 0 tells it ------------------------------------------------------------

    def start(
        self, stored: Arm | None, lead: NearMiss | None = None, gain: Gain | None = None
    ) -> None:
        """Begin, from the plan a previous job stored (None: from scratch) and, where that is
        the baseline, the lead it stored with it; ``gain``: the stored plan's, where it goes
        straight to the check against plain DDP (its block size: `check_steps_for`)."""
        self.stored = stored
        self.estimate = None if stored is None or gain is None else gain.ratio
        if stored is None:
            self._open()
        elif stored == self.baseline:
            if lead is not None and lead.arm != self.baseline:
                self.phase = "confirm"
                self._begin(self.baseline, lead.arm, "retry")
            else:
                self._lock()
        elif self.catch and self.needs_hook(stored):
            self.incumbent = stored
            self._lock()
        else:
            self.phase = "confirm"
            self._begin(self.baseline, stored, "confirm")

    def resume(
        self,
        won: Arm | None,
        gain: Gain | None,
        fusion_near: NearMiss | None,
        fusion_left: Sequence[int] = (),
        estimate: float | None = None,
    ) -> None:
        """Begin where a job that ended undecided stopped: from screening (its trials are in the
        studies: classes it screened are not screened again), with the plan that had won so far
        as the incumbent (``won``, None: none had; ``gain``: its step over the baseline's where
        it had met the baseline), and its fusion size that came close still to meet that plan
        again (``fusion_near``). Its class tests that were left, or lost and are shortlisted
        again, run as they would have, then the fusion sizes it had left (``fusion_left``); the
        check or confirmation comes after them. ``estimate``: the plan's `estimate` as the job
        stored it (None: its gain's, where it has one)."""
        self.stored = won
        self._open(fusion_left)
        if won is not None:
            self.incumbent, self.gain = won, gain
            self.estimate = estimate if estimate is not None or gain is None else gain.ratio
        self.fusion.near = fusion_near

    def measure(self, arm: Arm, step_s: float) -> None:
        """One window's step (MAX over ranks), run under ``arm``."""
        m = self.match
        if m is None:
            return
        for challenger, outcome in m.measure(arm, step_s):
            self.history.append((m.kind, challenger, outcome))
            m.report(challenger, outcome)  # before what it leads to (`_settle`)
            if m.reference == self.baseline and m.kind not in ("recheck", "retry"):
                self._note_lead(challenger, outcome)
            if m.kind == "fusion":
                self.fusion.ended(challenger, outcome.challenger_won, outcome.gain)
        if m.over:
            self.match = None
            self._settle(m, *self._best(m))

    def _best(self, m: Match) -> tuple[Arm, Outcome]:
        """Of a match's ended tests, the one it leads to: the challenger that won, the faster
        on the median where two did (the other meets it next: `FusionStage.settle`)."""
        won = sorted(m.ended, key=lambda e: (not e[1].challenger_won, e[1].gain.ratio))
        if m.kind == "fusion":
            self.fusion.settle([c.fusion_bytes for c, o in won if o.challenger_won])
        return won[0]

    def screened(self, nominees: Sequence[tuple[int, Choice, float]]) -> None:
        """The class searches are done: (class, a choice, latency it saves), up to two choices
        a class (`autotune.tuning.shortlist.shortlist`). A class's second paired test meets
        whichever won its first."""
        if self.phase != "screening":
            return
        ordered = sorted(nominees, key=lambda n: -n[2])
        self._queue = [(cls, choice) for cls, choice, _ in ordered]
        for cls, choice, _ in reversed(ordered):  # each class's largest saving last: kept
            self._screened[cls] = choice
        self.phase = "classes"
        if not self._joint():
            self._next()

    def _joint(self) -> bool:
        """Start the paired test of the classes' fastest choices together, if two or more have
        one. Won, only the other shortlisted choices meet it after; lost, each class meets the
        incumbent alone (docs/TUNER.md, "The classes together first")."""
        first = {c: ch for c, ch in self._screened.items() if self.incumbent.choice(c) != ch}
        if len(first) < 2:
            return False
        joint = Arm.of({**self.incumbent.as_dict(), **first}, self.incumbent.fusion_bytes)
        self._trying, self._joint_arm = None, joint
        self._begin(self.incumbent, joint, "joint")
        return True

    def tick(self, iteration: int) -> None:
        """At an exchange while locked: start the re-check when it is due."""
        if not self.settled:
            return
        if self._locked_at is None:
            self._locked_at = iteration
        elif (
            self.recheck_every > 0
            and self.incumbent != self.baseline
            and iteration - self._locked_at >= self.recheck_every
        ):
            self._begin(self.baseline, self.incumbent, "recheck", RECHECK_PAIRS)

    def caught(self, kept: bool, outcome: Outcome | None) -> None:
        """The check against plain DDP is over, on every rank alike: ``kept``, the incumbent runs
        on through the hook, its gain the check's where it measured one (``outcome``; None: it
        could not run); else the job runs plain DDP (it has unhooked), and the baseline is kept.
        Where this round searched, its lead is then the plan that had beaten the baseline before
        the plan that lost here beat it (`_beaten`), if one did and it needs the hook: a test
        between two plans both ahead of the baseline may be won by the one that is not ahead of
        plain DDP, and the job, unhooked, runs no other. Else the plan that lost here, if it was
        ahead by `NEAR_MISS_BELOW` on the median (not beyond noise), as a near miss of the check.
        Else no lead: the round's other challengers lost to the plan that lost here."""
        if self.phase != "catch":
            return
        if outcome is not None:
            self.history.append(("catch", self.incumbent, outcome))
        if kept:
            if outcome is not None:
                self.gain, self.against_plain = outcome.gain, True
        else:
            self._lead = self._lead_after_check(outcome) if self._searched else None
            self.incumbent, self.gain, self.estimate = self.baseline, None, None
        self.phase = "locked"
        self._locked_at = None

    def _lead_after_check(self, outcome: Outcome | None) -> NearMiss | None:
        """The next job's lead where the incumbent lost the check against plain DDP (`caught`)."""
        beaten = self._beaten
        # One that runs without the hook (a fusion size alone) is what DDP's bucket-size search
        # meets once unhooked.
        if beaten is not None and self.needs_hook(beaten.arm):
            return beaten
        if outcome is not None and outcome.gain.ratio < NEAR_MISS_BELOW:
            return NearMiss(self.incumbent, outcome.gain, "checked")
        return None

    def freeze(self) -> None:
        """Stop comparing: the incumbent runs from now on (the storage failed)."""
        self.match = None
        self._queue, self.fusion.pending = [], []
        self._lock()

    # -- transitions ---------------------------------------------------------------------

    def _open(self, fusion: Sequence[int] | None = None) -> None:
        self.incumbent, self.gain, self.against_plain = self.baseline, None, False
        self.estimate = None
        self._near, self._lead, self._beaten = {}, None, None
        self._searched = True
        self.phase = "screening"  # the tuner's class searches take over; see `screened`
        self._screened, self._joint_arm, self._queue = {}, None, []
        self.fusion.open(fusion)

    def _next(self) -> None:
        self._trying = None
        if self._take():
            return
        if self.phase == "classes":
            if self._combine():
                return
            self.phase = "fusion"
        if self.phase != "fusion":
            return
        # The fusion sizes meet the classes' winner, with its choices (`FusionStage.plan`), two
        # at once where two are left: they share its iterations (`autotune.tuning.match`).
        fused = self.fusion.next(self.incumbent) or self.fusion.again(
            self.incumbent, self._screened
        )
        if fused is not None:
            self._begin(self.incumbent, fused, "fusion", also=self.fusion.next(self.incumbent))
            return
        # A plan that meets plain DDP next is not confirmed against the baseline first: the
        # check is that test against a stronger baseline (the hook's cost taken out).
        checked = self.catch and self.needs_hook(self.incumbent)
        if self.incumbent != self.baseline and self.gain is None and not checked:
            self.phase = "confirm"
            self._begin(self.baseline, self.incumbent, "confirm")
        else:
            self._lock()

    def _take(self) -> bool:
        """Start the paired test of the first class challenger queued that is not the
        incumbent's plan; False if none is left."""
        while self._queue:
            cls, choice = self._queue.pop(0)
            challenger = self.incumbent.with_class(cls, choice)
            if challenger != self.incumbent:
                self._trying = (cls, choice)
                self._begin(self.incumbent, challenger, "class")
                return True
        return False

    def _combine(self) -> bool:
        """Start the combined paired test of the classes' near misses, if two or more are left."""
        near, self._near = self._near, {}
        # A class that a later paired test won keeps its winner.
        kept = {
            c: choice
            for c, (choice, _) in near.items()
            if self.incumbent.choice(c) == BASELINE_CHOICE
        }
        if len(kept) < 2:
            return False
        combined = Arm.of({**self.incumbent.as_dict(), **kept}, self.incumbent.fusion_bytes)
        if combined == self._joint_arm:
            return False  # the classes' fastest together, lost this round: not tested again
        self._begin(self.incumbent, combined, "combined")
        return True

    def _begin(
        self, reference: Arm, challenger: Arm, kind: str, pairs: int = 0, also: Arm | None = None
    ) -> None:
        """A paired test of ``max_pairs`` (or ``pairs``); a search's may go on to twice that for a
        promising challenger (`autotune.tuning.paired_test`), a re-check is kept short. ``also``:
        a second challenger, tested beside the first against the same reference."""
        max_pairs = max(pairs or self.max_pairs, MIN_PAIRS)
        extend_to = None if kind == "recheck" else 2 * max_pairs
        rivals = [
            Rival(arm, PairedTest(max_pairs, warmup=self.warmup, extend_to=extend_to))
            for arm in (challenger, also)
            if arm is not None
        ]
        self.match = Match(reference, rivals, kind)

    def _settle(self, m: Match, challenger: Arm, outcome: Outcome) -> None:
        """A match is over: ``challenger``'s test, the one it leads to (`_best`), moves the
        search on."""
        versus_baseline = m.reference == self.baseline
        if m.kind == "recheck":
            second, self._second_look = self._second_look, False
            if outcome.gain.ratio < 1.0:  # still faster: the re-check is cheap, not a proof
                if not self.against_plain:  # the check's gain is against plain DDP: it stands
                    self.gain = outcome.gain
                self._locked_at = None
            elif outcome.gain.low <= 1.0 and not second:  # not slower beyond noise: look again
                self._second_look = True
                self._begin(self.baseline, self.incumbent, "recheck", RECHECK_PAIRS)
            else:
                self.round += 1
                self._open()
            return
        if m.kind in ("confirm", "retry"):
            if outcome.challenger_won:
                self.incumbent, self.gain = challenger, outcome.gain
                self.estimate = outcome.gain.ratio
            else:
                self.incumbent, self.gain, self.estimate = self.baseline, None, None
            self._lock()
            return
        if outcome.challenger_won:
            if not versus_baseline and self.gain is not None:
                self._beaten = NearMiss(self.incumbent, self.gain, "beaten")
            self.incumbent = challenger
            self.gain = outcome.gain if versus_baseline else None
            ratio, before = outcome.gain.ratio, self.estimate
            self.estimate = ratio if versus_baseline else None if before is None else before * ratio
        elif m.kind == "class" and self._trying is not None and outcome.gain.ratio < 1.0:
            cls, choice = self._trying
            if cls not in self._near or outcome.gain.ratio < self._near[cls][1]:
                self._near[cls] = (choice, outcome.gain.ratio)
        self._next()

    def _note_lead(self, challenger: Arm, outcome: Outcome) -> None:
        """A lost paired test against the baseline: its challenger leads if it came closest so
        far."""
        ratio = outcome.gain.ratio
        if outcome.challenger_won or not ratio < NEAR_MISS_BELOW:
            return
        if self._lead is None or ratio < self._lead.gain.ratio:
            self._lead = NearMiss(challenger, outcome.gain)

    def _lock(self) -> None:
        """Lock the incumbent; one that needs the hook goes to the check against plain DDP
        first, where the job has it."""
        self.phase = "catch" if self.catch and self.needs_hook(self.incumbent) else "locked"
        self._locked_at = None
        if self.phase == "catch":
            self.check_steps = check_steps_for(self.estimate)
