"""The phases over whole plans (`autotune.tuning.plan_search`), driven with known step times: what
is shortlisted, tested, locked, re-checked, remembered as a near miss, and checked against
plain DDP."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from autotune.ddp.messages import message_sizes
from autotune.plan import Arm, Choice, Gain, NearMiss
from autotune.tuning.blocks import BLOCK_STEPS, CLEAR_BELOW, CLEAR_STEPS, check_steps_for
from autotune.tuning.paired_test import (
    Outcome,
)
from autotune.tuning.plan_search import NEAR_MISS_BELOW, PlanSearch
from autotune.tuning.shortlist import shortlist
from autotune.tuning.space import search_space

FUSION = (0, 1 << 20)
TREE = Choice("tree")


def plan_search(recheck_every: int = 0, catch: bool = False) -> PlanSearch:
    return PlanSearch(
        Arm(),
        fusion_options=FUSION,
        max_pairs=8,
        warmup=0,
        recheck_every=recheck_every,
        catch=catch,
    )


def drive(c: PlanSearch, step_of: object, iterations: int, start: int = 0) -> int:
    """Run ``iterations`` scheduled iterations (each measured as it runs); the last one."""
    assert callable(step_of)
    for i in range(start, start + iterations):
        arm = c.next_arm(c.incumbent.with_class(1 << 20, TREE) if c.phase == "screening" else None)
        c.measure(arm, step_of(arm, i))
        c.tick(i)
    return start + iterations


def test_a_plan_is_locked_only_after_beating_the_baseline_on_the_step() -> None:
    c = plan_search()
    c.start(None)
    assert c.phase == "screening"

    def step(arm: Arm, i: int) -> float:
        return 0.8 if arm.choice(1 << 20) == TREE else 1.0  # fusion changes nothing

    drive(c, step, 40)
    assert c.phase == "screening"
    c.screened([(1 << 20, TREE, 0.001)])
    drive(c, step, 60)
    assert c.settled and c.incumbent == Arm(((1 << 20, TREE),), 0)
    assert c.gain is not None and c.gain.ratio == pytest.approx(0.8)
    # The class first, then the fusion size with the class's choice, which changes nothing.
    assert [(k, a, o.challenger_won) for k, a, o in c.history] == [
        ("class", Arm(((1 << 20, TREE),), 0), True),
        ("fusion", Arm(((1 << 20, TREE),), 1 << 20), False),
    ]


def test_latency_alone_never_locks_a_plan_whose_step_is_slower() -> None:
    c = plan_search()
    c.start(None)
    drive(c, lambda arm, i: 1.0, 40)
    # Screening found TREE much faster per message, but it burns the step.
    c.screened([(1 << 20, TREE, 0.5)])
    drive(c, lambda arm, i: 1.2 if arm.choice(1 << 20) == TREE else 1.0, 40)
    assert c.settled and c.baseline_kept and c.gain is None


def test_a_stored_plan_is_confirmed_against_the_baseline_or_dropped() -> None:
    stored = Arm(((1 << 20, TREE),), 1 << 20)
    c = plan_search()
    c.start(stored)
    assert c.phase == "confirm"
    drive(c, lambda arm, i: 1.1 if arm == stored else 1.0, 40)
    assert c.baseline_kept
    c = plan_search()
    c.start(stored)
    drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 40)
    assert c.settled and c.incumbent == stored


def test_search_duels_may_be_extended_and_re_checks_may_not() -> None:
    stored = Arm(((1 << 20, TREE),), 0)
    c = plan_search(recheck_every=30)
    c.start(stored)
    assert c.match is not None and c.match.kind == "confirm" and not c.rechecking
    assert (c.match.duel.max_pairs, c.match.duel.extend_to) == (8, 16)
    end = drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 40)
    assert c.settled
    while c.match is None:
        end = drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 1, end)
    assert c.match.kind == "recheck" and c.rechecking and not c.settled
    assert c.match.duel.extend_to == c.match.duel.max_pairs


def test_a_locked_plan_whose_gain_is_gone_falls_back_and_tuning_starts_over() -> None:
    stored = Arm(((1 << 20, TREE),), 0)
    c = plan_search(recheck_every=30)
    c.start(stored)
    end = drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 40)
    assert c.settled and c.incumbent == stored
    # Still faster at the first re-check: kept.
    end = drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 60, end)
    assert c.incumbent == stored and c.duels("recheck") >= 1
    # The advantage is gone: the next re-check falls back and re-opens the search.
    drive(c, lambda arm, i: 1.1 if arm == stored else 1.0, 60, end)
    assert c.incumbent == c.baseline and c.round == 1 and c.phase != "locked"


RING, HRING, NATIVE = Choice("ring"), Choice("hierarchical_ring"), Choice("native")
SHM = Choice("shm")


def test_when_the_latency_winner_loses_on_the_step_its_runner_up_gets_its_own_duel() -> None:
    cls = 2 << 20
    c = plan_search()
    c.start(None)
    drive(c, lambda arm, i: 1.0, 40)
    assert c.phase == "screening"
    c.screened(
        [
            (cls, choice, saved)
            for choice, saved in shortlist({NATIVE: 10.0, RING: 8.0, HRING: 8.4}, NATIVE)
        ]
    )

    def step(arm: Arm, i: int) -> float:  # ring's step loses, the hierarchical ring's wins
        return {RING: 1.05, HRING: 0.9}.get(arm.choice(cls), 1.0)

    drive(c, step, 200)
    assert c.settled and c.incumbent == Arm(((cls, HRING),), 0)
    assert [(k, a.choice(cls), o.challenger_won) for k, a, o in c.history if k == "class"] == [
        ("class", RING, False),
        ("class", HRING, True),
    ]
    # Without the runner-up rule it would have kept the baseline: the same plan search with the
    # latency winner only.
    c = plan_search()
    c.start(None)
    drive(c, lambda arm, i: 1.0, 40)
    c.screened([(cls, RING, 2.0)])
    drive(c, step, 200)
    assert c.settled and c.baseline_kept


def test_a_re_check_lost_within_noise_looks_again_before_falling_back() -> None:
    stored = Arm(((1 << 20, TREE),), 0)

    def run(noisy_then: float) -> PlanSearch:
        """Locked on ``stored`` (0.9x); at the first re-check its steps alternate 0.85x and
        1.2x (a median above 1, but not slower beyond noise); then ``noisy_then``."""
        c = plan_search(recheck_every=30)
        c.start(stored)
        end = drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 40)
        assert c.settled and c.incumbent == stored
        while c.match is None:
            end = drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 1, end)
        assert c.rechecking
        k = [0]

        def noisy(arm: Arm, i: int) -> float:
            if arm != stored:
                return 1.0
            k[0] += 1
            return 0.85 if k[0] % 3 == 0 else 1.2

        while c.match is not None and c.duels("recheck") == 0:
            end = drive(c, noisy, 1, end)
        first = c.history[-1][2]
        assert first.gain.ratio >= 1.0 and first.gain.low <= 1.0, first
        # Not dropped yet: a second look is under way.
        assert c.rechecking and c.incumbent == stored and c.round == 0
        drive(c, lambda arm, i: noisy_then if arm == stored else 1.0, 40, end)
        return c

    kept = run(0.9)
    assert kept.incumbent == stored and kept.round == 0 and kept.duels("recheck") == 2
    dropped = run(1.1)  # the second look is slower: the plan is dropped
    assert dropped.incumbent == dropped.baseline and dropped.round == 1


def test_classes_whose_gains_are_too_small_alone_meet_the_incumbent_together() -> None:
    small, large = 256 << 10, 2 << 20

    def run(alone: float, joint_first: bool = True) -> PlanSearch:
        """Each class's hierarchical ring makes the step ``alone`` times the baseline's, the
        small class's ring 1.05 times; the challenger's steps swing by -8% to +8% around that,
        the same way every time."""
        c = PlanSearch(Arm(), fusion_options=(0,), max_pairs=8, warmup=0, recheck_every=0)
        c.start(None)
        swing = [1.08, 0.92, 0.98, 1.02]  # median 1: a pair in four above 1 at alone = 0.96
        k = [0]

        def step(arm: Arm, i: int) -> float:
            if arm == Arm():
                return 1.0
            k[0] += 1
            on = sum(arm.choice(cls) == HRING for cls in (small, large))
            return alone**on * (1.05 if arm.choice(small) == RING else 1.0) * swing[k[0] % 4]

        assert c.phase == "screening"
        # The small class's ring screened fastest, and costs the step: the classes' fastest
        # together (ring, hierarchical ring) lose, and each class meets the incumbent alone.
        c.screened([(small, RING, 0.003), (small, HRING, 0.002), (large, HRING, 0.001)])
        drive(c, step, 400)
        return c

    c = run(0.96)
    kinds = [(k, o.challenger_won, round(o.gain.ratio, 2)) for k, _, o in c.history]
    assert kinds[0][:2] == ("joint", False)
    # Each alone: ahead on the median, not beyond noise at 8 pairs. Together: 0.92, won.
    assert [k[0] for k in kinds[1:4]] == ["class", "class", "class"]
    assert [k[2] for k in kinds[1:4] if not k[1]] == [1.05, 0.96, 0.96]
    assert kinds[4][:2] == ("combined", True)
    assert c.settled and c.incumbent == Arm(((small, HRING), (large, HRING)), 0)
    assert c.gain is not None and c.gain.ratio == pytest.approx(0.96**2 * 0.98, rel=0.05)
    # Challengers not ahead on the median are not combined: the baseline is kept.
    c = run(1.01)
    assert [k for k, _, _ in c.history] == ["joint", "class", "class", "class"]
    assert c.settled and c.baseline_kept


def test_the_classes_fastest_choices_meet_the_incumbent_together_first() -> None:
    small, large = 256 << 10, 2 << 20

    def step(arm: Arm, i: int) -> float:
        """Each class's shared memory makes the step 0.9 times the baseline's (0.81 both),
        the large class's ring 0.95 times."""
        ratio = {SHM: 0.9, RING: 0.95}
        return ratio.get(arm.choice(small), 1.0) * ratio.get(arm.choice(large), 1.0)

    c = PlanSearch(Arm(), fusion_options=(0,), max_pairs=8, warmup=0, recheck_every=0)
    c.start(None)
    c.screened([(small, SHM, 0.003), (large, SHM, 0.002), (large, RING, 0.0018)])
    assert c.match is not None and c.match.kind == "joint"
    assert c.match.challenger == Arm(((small, SHM), (large, SHM)), 0)
    drive(c, step, 200)
    # Won at once; no class's fastest is tested alone after it, the runner-up is, and loses.
    tests = [(k, a.describe(), o.challenger_won) for k, a, o in c.history]
    assert tests == [
        ("joint", Arm(((small, SHM), (large, SHM)), 0).describe(), True),
        ("class", Arm(((small, SHM), (large, RING)), 0).describe(), False),
    ]
    assert c.history[0][2].gain.pairs == 6  # the least paired test
    assert c.settled and c.incumbent == Arm(((small, SHM), (large, SHM)), 0)
    assert c.gain is not None and c.gain.ratio == pytest.approx(0.81)
    # One class shortlisted: nothing to test together, its paired test is the first.
    c = PlanSearch(Arm(), fusion_options=(0,), max_pairs=8, warmup=0, recheck_every=0)
    c.start(None)
    c.screened([(large, SHM, 0.002), (large, RING, 0.0018)])
    assert c.match is not None and c.match.kind == "class"


def swinging(alone: float, plan: Arm) -> Callable[[Arm, int], float]:
    """Steps: 1.0 for anything but ``plan``, whose steps swing by -8% to +8% around ``alone``
    (a pair in four above 1 at alone = 0.96: ahead on the median, never beyond noise)."""
    swing = [1.08, 0.92, 0.98, 1.02]
    k = [0]

    def step(arm: Arm, i: int) -> float:
        if arm != plan:
            return 1.0
        k[0] += 1
        return alone * swing[k[0] % 4]

    return step


def test_a_kept_baseline_remembers_the_plan_that_came_close_and_the_next_job_retries_it() -> None:
    fused = Arm((), 1 << 20)

    def first_job(alone: float) -> PlanSearch:
        c = plan_search()
        c.start(None)
        assert c.phase == "screening"
        c.screened([])  # nothing shortlisted: the fusion sizes meet the baseline
        assert c.phase == "fusion"
        drive(c, swinging(alone, fused), 40)
        assert c.settled and c.baseline_kept
        return c

    # Fusion at 0.96x, not beyond noise: the baseline is kept, and fusion is its lead.
    c = first_job(0.96)
    assert [(k, o.challenger_won) for k, _, o in c.history] == [("fusion", False)]
    assert c.lead is not None and c.lead.arm == fused
    assert c.lead.gain == c.history[0][2].gain and c.lead.gain.ratio == pytest.approx(0.96)
    # At 0.99x (the noise of cells with nothing to gain) nothing is remembered.
    assert NEAR_MISS_BELOW < 0.99 and first_job(0.99).lead is None
    lead = c.lead

    # The next job from that table: one paired test of the lead against the baseline first.
    nxt = plan_search()
    nxt.start(Arm(), lead)
    assert nxt.phase == "confirm" and nxt.match is not None and nxt.match.kind == "retry"
    assert (nxt.match.reference, nxt.match.challenger) == (Arm(), fused)
    drive(nxt, lambda arm, i: 0.9 if arm == fused else 1.0, 40)
    assert nxt.settled and nxt.incumbent == fused and nxt.lead is None
    assert nxt.gain is not None and nxt.gain.ratio == pytest.approx(0.9)
    # Lost again, even close: the baseline, and the lead is forgotten (one retry per lead).
    nxt = plan_search()
    nxt.start(Arm(), lead)
    drive(nxt, swinging(0.96, fused), 40)
    assert nxt.settled and nxt.baseline_kept and nxt.lead is None
    assert [k for k, _, _ in nxt.history] == ["retry"]
    # Without a lead a stored baseline locks at once, as before.
    nxt = plan_search()
    nxt.start(Arm())
    assert nxt.settled and nxt.baseline_kept and nxt.match is None


def test_the_lead_is_the_closest_challenger_and_a_won_plan_has_none() -> None:
    cls = 2 << 20
    tree = Arm(((cls, TREE),), 0)
    fused = Arm((), 1 << 20)
    c = plan_search()
    c.start(None)
    c.screened([(cls, TREE, 0.001)])
    near_tree, near_fused = swinging(0.955, tree), swinging(0.96, fused)
    drive(c, lambda arm, i: near_tree(arm, i) if arm == tree else near_fused(arm, i), 80)
    assert c.settled and c.baseline_kept
    assert [(k, round(o.gain.ratio, 3)) for k, _, o in c.history] == [
        ("class", 0.955),
        ("fusion", 0.96),
    ]
    assert c.lead is not None and c.lead.arm == tree
    # A round that locks a plan leaves no lead, whatever came close before it won.
    c = plan_search()
    c.start(None)
    c.screened([(cls, TREE, 0.001)])
    drive(c, lambda arm, i: 0.8 if arm == tree else 1.0, 80)
    assert c.settled and c.incumbent == tree and c.lead is None


def test_where_the_job_steps_aside_a_plan_that_needs_the_hook_meets_plain_ddp_first() -> None:
    tree = Arm(((1 << 20, TREE),), 0)

    def won_by_tree(catch: bool) -> PlanSearch:
        c = plan_search(recheck_every=30, catch=catch)
        c.start(None)
        drive(c, lambda arm, i: 1.0, 40)
        c.screened([(1 << 20, TREE, 0.001)])
        drive(c, lambda arm, i: 0.8 if arm == tree else 1.0, 40)
        return c

    assert won_by_tree(catch=False).settled  # a job that keeps the hook anyway: locked
    c = won_by_tree(catch=True)
    assert c.phase == "catch" and c.incumbent == tree and c.match is None
    assert c.steady and not c.settled  # the tuner's windows compare nothing meanwhile
    # Rank 0's windows go on arriving from the plan's blocks: nothing starts, no re-check.
    end = drive(c, lambda arm, i: 0.8 if arm == tree else 1.0, 200, 80)
    assert c.phase == "catch" and c.match is None and c.next_arm() == tree
    hooked_gain = c.gain
    assert hooked_gain is not None and hooked_gain.ratio == pytest.approx(0.8)

    # Kept: locked, its gain the check's against plain DDP, which later re-checks (against
    # the hooked baseline) do not replace.
    against_plain = Gain(0.93, 0.9, 0.97, 12)
    c.caught(True, Outcome(True, against_plain, "ahead on the median"))
    assert c.settled and c.incumbent == tree and c.gain == against_plain and c.against_plain
    assert c.history[-1][0] == "catch" and c.history[-1][1] == tree
    while c.match is None:
        end = drive(c, lambda arm, i: 0.8 if arm == tree else 1.0, 1, end)
    assert c.rechecking
    drive(c, lambda arm, i: 0.8 if arm == tree else 1.0, 40, end)
    assert c.settled and c.incumbent == tree and c.gain == against_plain
    assert c.history[-1][0] == "recheck"

    # Lost: the baseline is kept, with no lead; the verdict's history ends with the check against
    # plain DDP.
    c = won_by_tree(catch=True)
    c.caught(False, Outcome(False, Gain(1.04, 0.99, 1.1, 24), "not ahead on the median"))
    assert c.settled and c.baseline_kept and c.gain is None and c.lead is None
    assert [k for k, _, _ in c.history][-1] == "catch"
    c.caught(True, None)  # a stale word after the check against plain DDP changes nothing
    assert c.baseline_kept

    # Not run (the reducer cannot be rebuilt): locked on the paired tests' word.
    c = won_by_tree(catch=True)
    c.caught(True, None)
    assert c.settled and c.incumbent == tree and c.gain == hooked_gain and not c.against_plain


def at_check(steps: dict[Arm, float]) -> PlanSearch:
    """A search with the check against plain DDP to follow, from empty, `TREE` shortlisted on the
    1 MiB class, driven with ``steps`` (by plan; any other 1.0) until its plan goes to the check."""
    c = plan_search(catch=True)
    c.start(None)
    c.screened([(1 << 20, TREE, 0.001)])
    drive(c, lambda arm, i: steps.get(arm, 1.0), 60)
    assert c.phase == "catch"
    return c


def test_where_the_check_loses_the_plan_its_plan_beat_is_the_next_jobs_lead() -> None:
    """The held-out LSTM's first run (docs/BENCHMARKS.md): its classes' plan beat the baseline,
    a fusion size on top of it beat that plan, then lost the check against plain DDP, and the
    job unhooked with no lead, so no later job tried the classes' plan again. Now the plan that
    had beaten the baseline is stored as the lead, the next job retries it (through the hook,
    then against plain DDP), and a job retrying a lead stores none for the next."""
    tree = Arm(((1 << 20, TREE),), 0)
    both = tree.with_fusion(1 << 20)

    def step(arm: Arm, i: int) -> float:
        return {tree: 0.9, both: 0.7}.get(arm, 1.0)

    lost = Outcome(False, Gain(0.974, 0.93, 1.01, 24), "not beyond noise")
    c = at_check({tree: 0.9, both: 0.7})
    assert c.incumbent == both and [k for k, _, _ in c.history] == ["class", "fusion"]
    tree_gain = c.history[0][2].gain
    c.caught(False, lost)
    assert c.settled and c.baseline_kept and c.gain is None
    assert c.lead == NearMiss(tree, tree_gain, "beaten")
    assert c.lead.gain.ratio == pytest.approx(0.9)
    # Kept by the check, there is nothing to lead.
    c = at_check({tree: 0.9, both: 0.7})
    c.caught(True, Outcome(True, Gain(0.75, 0.7, 0.8, 12), "ahead beyond noise"))
    assert c.incumbent == both and c.lead is None
    # The plan that lost the check had beaten the baseline itself: nothing it beat to retry.
    c = at_check({tree: 0.9})
    assert c.incumbent == tree and [k for k, _, _ in c.history] == ["class", "fusion"]
    c.caught(False, lost)
    assert c.baseline_kept and c.lead is None
    # Beaten twice: the lead is the last plan that met the baseline (a plan that beat only
    # another challenger has no gain over the baseline to carry).
    ring = Arm(((1 << 20, Choice("ring")),), 0)
    c = plan_search(catch=True)
    c.start(None)
    c.screened([(1 << 20, TREE, 0.002), (1 << 20, Choice("ring"), 0.001)])
    steps = {tree: 0.9, ring: 0.8, ring.with_fusion(1 << 20): 0.7}
    drive(c, lambda arm, i: steps.get(arm, 1.0), 90)
    assert [(k, a, o.challenger_won) for k, a, o in c.history] == [
        ("class", tree, True),
        ("class", ring, True),
        ("fusion", ring.with_fusion(1 << 20), True),
    ]
    c.caught(False, lost)
    assert c.lead == NearMiss(tree, tree_gain, "beaten")
    lead = c.lead

    # The next job retries it through the hook, then checks it against plain DDP; lost there
    # too, it stores no lead: one more test per plan.
    nxt = plan_search(catch=True)
    nxt.start(Arm(), lead)
    assert nxt.match is not None and nxt.match.kind == "retry" and nxt.match.challenger == tree
    drive(nxt, step, 40)
    assert nxt.phase == "catch" and nxt.incumbent == tree
    nxt.caught(False, lost)
    assert nxt.baseline_kept and nxt.lead is None


def test_a_check_lost_ahead_by_3_percent_leaves_its_plan_as_the_next_jobs_lead() -> None:
    """A near miss of the check against plain DDP, as of a paired test against the baseline: the
    next job retries it once. A plan the checked one beat leads before it (a first check of
    another plan tells more than a second of the same), and a stored plan or a retried lead
    that loses its check leaves none (one more test, not one per job)."""
    tree = Arm(((1 << 20, TREE),), 0)
    both = tree.with_fusion(1 << 20)
    close = Outcome(False, Gain(0.95, 0.9, 1.01, 24), "not beyond noise")

    c = at_check({tree: 0.9})
    c.caught(False, close)
    assert c.baseline_kept and c.lead == NearMiss(tree, close.gain, "checked")
    assert c.lead.describe() == "1 MiB: tree (0.95x over 24 pairs of blocks)"
    # Ahead by less than 3% (or behind): nothing.
    c = at_check({tree: 0.9})
    c.caught(False, Outcome(False, Gain(0.975, 0.9, 1.03, 24), "not beyond noise"))
    assert c.lead is None
    # Beside a plan the checked one beat, that one leads.
    c = at_check({tree: 0.9, both: 0.7})
    c.caught(False, close)
    assert c.lead is not None and c.lead.kind == "beaten" and c.lead.arm == tree
    # The next job: the retry, then its check; lost close again, no lead.
    lead = NearMiss(tree, close.gain, "checked")
    nxt = plan_search(catch=True)
    nxt.start(Arm(), lead)
    drive(nxt, lambda arm, i: 0.9 if arm == tree else 1.0, 40)
    assert nxt.phase == "catch"
    nxt.caught(False, close)
    assert nxt.baseline_kept and nxt.lead is None
    # A stored plan checked again, lost close: no lead either.
    nxt = plan_search(catch=True)
    nxt.start(tree)
    assert nxt.phase == "catch"
    nxt.caught(False, close)
    assert nxt.baseline_kept and nxt.lead is None


def test_a_beaten_plan_that_runs_without_the_hook_is_no_lead() -> None:
    """A fusion size alone (DDP runs it as its bucket size once autotune unhooks) beaten by a
    plan that then lost the check: DDP's bucket-size search meets that size, so no lead."""
    fused = Arm((), 1 << 20)
    tree_fused = Arm(((1 << 20, TREE),), 1 << 20)
    c = plan_search(catch=True)
    c.resume(fused, Gain(0.9, 0.85, 0.95, 10), None)  # a short job's fusion size had won
    c.screened([(1 << 20, TREE, 0.001)])
    drive(c, lambda arm, i: {fused: 0.9, tree_fused: 0.7}.get(arm, 1.0), 40)
    assert c.incumbent == tree_fused and c.phase == "catch"
    assert [(k, a) for k, a, _ in c.history] == [("class", tree_fused)]
    c.caught(False, Outcome(False, Gain(1.01, 0.95, 1.05, 24), "not ahead"))
    assert c.baseline_kept and c.lead is None


def test_a_fusion_only_plan_has_no_catch_and_a_stored_hook_plan_goes_straight_to_it() -> None:
    fused = Arm((), 1 << 20)
    c = plan_search(catch=True)
    c.start(None)
    drive(c, lambda arm, i: 0.8 if arm == fused else 1.0, 40)
    c.screened([])
    drive(c, lambda arm, i: 0.8 if arm == fused else 1.0, 40)
    assert c.settled and c.incumbent == fused  # DDP runs it: its bucket paired tests say the rest
    # A stored plan that needs the hook: the check against plain DDP, instead of a confirm against
    # the hooked baseline; without the check against plain DDP, the confirm.
    stored = Arm(((1 << 20, TREE),), 0)
    c = plan_search(catch=True)
    c.start(stored)
    assert c.phase == "catch" and c.incumbent == stored and c.match is None and not c.history
    c = plan_search(catch=True)
    c.start(fused)
    assert c.phase == "confirm" and c.match is not None
    # A stored lead that needs the hook: its retry against the hooked baseline, then the check
    # against plain DDP.
    c = plan_search(catch=True)
    c.start(Arm(), NearMiss(stored, Gain(0.96, 0.9, 1.02, 10)))
    assert c.match is not None and c.match.kind == "retry"
    drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 40)
    assert c.phase == "catch" and c.incumbent == stored


def test_the_check_runs_in_blocks_of_1_timed_step_where_the_plans_gain_is_clear() -> None:
    """The check's block size goes by the plan's step over the baseline's as its paired tests
    measured it, multiplied along the wins that put it in place: `CLEAR_STEPS` at `CLEAR_BELOW`
    or less (the example MLP's classes and fused message, 0.62-0.66x), else `BLOCK_STEPS`."""
    tree = Arm(((1 << 20, TREE),), 0)
    both = tree.with_fusion(1 << 20)

    # 0.8x the baseline, then the fused plan 0.875x that: 0.7x in all, clear.
    c = at_check({tree: 0.8, both: 0.7})
    assert [(k, o.challenger_won) for k, _, o in c.history] == [("class", True), ("fusion", True)]
    assert c.incumbent == both and c.estimate == pytest.approx(0.7)
    assert c.gain is None  # the status's gain: none has met the baseline since the fusion size
    assert c.check_steps == CLEAR_STEPS == 1
    # 0.8x alone (the fusion size lost): not clear.
    c = at_check({tree: 0.8, both: 0.85})
    assert c.incumbent == tree and c.estimate == pytest.approx(0.8)
    assert c.check_steps == BLOCK_STEPS == 4
    # A stored plan goes straight to the check: its stored gain says which (none: not clear).
    for gain, steps in ((Gain(0.7, 0.6, 0.8, 6), 1), (Gain(0.9, 0.85, 0.95, 12), 4), (None, 4)):
        c = plan_search(catch=True)
        c.start(tree, None, gain)
        assert c.phase == "catch" and c.check_steps == steps, gain
    # A lead retried: its retry's gain.
    c = plan_search(catch=True)
    c.start(Arm(), NearMiss(tree, Gain(0.96, 0.9, 1.02, 10)))
    drive(c, lambda arm, i: 0.7 if arm == tree else 1.0, 40)
    assert c.phase == "catch" and c.estimate == pytest.approx(0.7) and c.check_steps == 1
    # A job resumed where a short one ended: the estimate it stored, else its stored gain's.
    for estimate, gain, steps in (
        (0.66, None, 1),
        (None, Gain(0.7, 0.6, 0.8, 6), 1),
        (None, None, 4),
    ):
        c = plan_search(catch=True)
        c.resume(both, gain, None, (), estimate)
        c.screened([])
        assert c.phase == "catch" and c.incumbent == both and c.check_steps == steps
    # Where the check loses, the baseline carries no estimate.
    c.caught(False, Outcome(False, Gain(1.02, 0.95, 1.1, 12), "not beyond noise"))
    assert c.estimate is None
    assert [check_steps_for(e) for e in (None, 0.5, CLEAR_BELOW, 0.76, 1.0)] == [4, 1, 1, 4, 4]


def test_a_plan_that_needs_no_hook_is_locked_without_the_check_against_plain_ddp() -> None:
    # autotune-nccl's cells: NCCL runs them from its tuner plugin's table once autotune unhooks
    # (`autotune.algorithms.carried`), so there is no hook to check against plain DDP.
    cell = Choice("nccl.ring.ll128")
    won = Arm(((1 << 20, cell),), 0)

    def search() -> PlanSearch:
        return PlanSearch(
            Arm(),
            fusion_options=FUSION,
            max_pairs=8,
            warmup=0,
            recheck_every=0,
            catch=True,
            needs_hook=lambda arm: any(c != cell for _, c in arm.choices),
        )

    c = search()
    c.start(None)
    drive(c, lambda arm, i: 1.0, 40)
    c.screened([(1 << 20, cell, 0.001)])
    drive(c, lambda arm, i: 0.8 if arm == won else 1.0, 60)
    assert c.settled and c.phase == "locked" and c.incumbent == won
    assert [k for k, _, _ in c.history] == ["class", "fusion"]
    # Stored, it is confirmed against the baseline (through the hook), then locked.
    c = search()
    c.start(won)
    assert c.phase == "confirm" and c.match is not None
    drive(c, lambda arm, i: 0.8 if arm == won else 1.0, 40)
    assert c.settled and c.incumbent == won


def test_the_estimate_of_iterations_left_counts_down_and_is_zero_once_locked() -> None:
    """`PlanSearch.iterations_left`: None while loading and, before screening, until screening's
    windows are known; the paired test under way counts down one per measured iteration."""
    c = plan_search()
    assert c.iterations_left(screening=30) is None  # loading
    c.start(None)
    assert c.phase == "screening"
    assert c.iterations_left(screening=None) is None
    # Screening's 30, then the fusion size (1 MiB) at 10 pairs, where one not ahead stops.
    assert c.iterations_left(screening=30) == 30 + 2 * 10
    c.screened([])  # nothing shortlisted: the fusion size meets the baseline
    assert c.phase == "fusion"
    # The fusion test under way: 8 pairs (16 iterations) to its max_pairs.
    assert c.iterations_left(screening=None) == 2 * 8

    def step(arm: Arm, i: int) -> float:
        return 1.0 + 0.01 * (i % 3)  # nothing to gain: the fusion size loses

    before = c.iterations_left(screening=None)
    drive(c, step, 1)
    after = c.iterations_left(screening=None)
    assert before is not None and after is not None and after == before - 1
    drive(c, step, 40, start=1)
    assert c.settled and c.baseline_kept and c.iterations_left(screening=None) == 0


def test_the_estimate_counts_two_fusion_sizes_as_sharing_the_incumbents_iterations() -> None:
    """Three fusion sizes to come: two meet the incumbent together (three iterations for a pair of
    each, to 10 pairs: 30), the third alone (20). Under way, the two at once count down to
    their 8 pairs each as 16 + 8 iterations (`autotune.tuning.match.Match.measurements_left`)."""
    mib = 1 << 20
    c = PlanSearch(
        Arm(), fusion_options=(0, mib, 4 * mib, 16 * mib), max_pairs=8, warmup=0, recheck_every=0
    )
    c.start(None)
    assert c.iterations_left(screening=30) == 30 + 3 * 10 + 2 * 10
    c.screened([])
    assert c.match is not None and len(c.match.rivals) == 2
    assert c.iterations_left(screening=None) == 16 + 8 + 2 * 10


def test_a_resumed_search_screens_first_and_meets_the_fusion_sizes_left() -> None:
    """A job that ended undecided: the next one starts at screening (`PlanSearch.resume`), and
    after the classes meets the fusion sizes the one before had left."""
    mib = 1 << 20
    for left in ([], [mib]):
        c = plan_search()
        c.resume(None, None, None, left)
        assert c.phase == "screening" and c.match is None and c.fused == (not left)
        assert c.fusion_left == left
        c.screened([(mib, TREE, 0.001)])
        assert c.phase == "classes" and c.match is not None
        drive(c, lambda arm, i: 1.0, 60)
        assert c.settled and c.fused and c.fusion_left == []
        assert [k for k, _, _ in c.history] == ["class"] + (["fusion"] if left else [])


def test_a_job_ending_among_the_fusion_sizes_leaves_the_next_those_not_met() -> None:
    """Two fusion sizes meet the incumbent together: each is left (`PlanSearch.fusion_left`)
    until its test has lost, or the meeting is over. One that won while the other goes on is
    still left: a job that ends then has not taken it."""
    mib = 1 << 20
    sizes = [mib, 4 * mib, 16 * mib]
    for one_mib, left_after in ((1.2, [4 * mib, 16 * mib]), (0.8, sizes)):
        c = PlanSearch(Arm(), fusion_options=(0, *sizes), max_pairs=8, warmup=0, recheck_every=0)
        c.start(None)
        assert c.fusion_left == sizes
        c.screened([])
        assert c.match is not None
        assert [r.challenger for r in c.match.rivals] == [Arm((), mib), Arm((), 4 * mib)]
        assert c.fusion_left == sizes

        def step(arm: Arm, i: int, one_mib: float = one_mib) -> float:
            return one_mib if arm.fusion_bytes == mib else 1.0  # 4 MiB changes nothing

        end = 0
        while not c.history:
            end = drive(c, step, 1, end)
        # 1 MiB decided at the first look; 4 MiB, within noise, goes on alone.
        assert [(a.fusion_bytes, o.challenger_won) for _, a, o in c.history] == [
            (mib, one_mib < 1.0)
        ]
        assert c.match is not None and c.match.rivals[0].challenger == Arm((), 4 * mib)
        assert c.fusion_left == left_after and not c.fused
        while len(c.history) < 2:
            end = drive(c, step, 1, end)
        # 4 MiB lost: what 1 MiB's test said is taken; 16 MiB meets the incumbent next.
        assert c.incumbent == (Arm((), mib) if one_mib < 1.0 else Arm())
        assert c.fusion_left == [16 * mib]


def test_of_two_fusion_sizes_that_won_together_the_faster_is_kept_and_the_other_meets_it() -> None:
    """1 MiB 0.8x the baseline's step, 4 MiB 0.7x: both win their tests at the first look. The
    faster on the median becomes the incumbent and the other meets it next, as it would have
    had the sizes met the incumbent one at a time; there it loses."""
    mib = 1 << 20
    one, four = Arm((), mib), Arm((), 4 * mib)
    c = PlanSearch(Arm(), fusion_options=(0, mib, 4 * mib), max_pairs=8, warmup=0, recheck_every=0)
    c.start(None)
    c.screened([])
    drive(c, lambda arm, i: {one: 0.8, four: 0.7}.get(arm, 1.0), 60)
    assert [(k, a, o.challenger_won, o.gain.pairs) for k, a, o in c.history] == [
        ("fusion", four, True, 6),
        ("fusion", one, True, 6),
        ("fusion", one, False, 6),  # 0.8 / 0.7: slower than the fused plan beyond noise
    ]
    assert c.history[2][2].gain.ratio == pytest.approx(0.8 / 0.7)
    assert c.settled and c.incumbent == four and c.fusion_left == []
    assert c.gain is not None and c.gain.ratio == pytest.approx(0.7)  # its test's: vs baseline


def test_a_plan_that_meets_plain_ddp_next_is_not_confirmed_against_the_hooked_baseline() -> None:
    """A class won, then a fusion size on top of it: its gain over the baseline is not known.
    Where the check against plain DDP follows, that is the test (against a stronger baseline);
    without it, the plan is confirmed against the baseline through the hook."""
    tree = Arm(((1 << 20, TREE),), 0)
    both = tree.with_fusion(1 << 20)

    def step(arm: Arm, i: int) -> float:
        return {tree: 0.9, both: 0.7}.get(arm, 1.0)

    kinds = {}
    for catch in (True, False):
        c = plan_search(catch=catch)
        c.start(None)
        c.screened([(1 << 20, TREE, 0.001)])
        drive(c, step, 60)
        assert c.phase == ("catch" if catch else "locked") and c.incumbent == both
        kinds[catch] = [k for k, _, _ in c.history]
    assert kinds[True] == ["class", "fusion"]
    assert kinds[False] == ["class", "fusion", "confirm"]


def test_a_fusion_size_that_makes_the_same_messages_as_one_met_already_is_skipped() -> None:
    """Fusion sizes are compared by the messages they make of the job's buckets now: one that
    makes the incumbent's, or those of a size tested this round, is not tested again."""
    buckets = [(1 << 20, "float32")] * 3  # 3 MiB of gradients: 4 and 16 MiB make one message
    options = (0, 1 << 20, 4 << 20, 16 << 20)

    def search(known: bool) -> PlanSearch:
        return PlanSearch(
            Arm(),
            fusion_options=options,
            max_pairs=8,
            warmup=0,
            recheck_every=0,
            messages=lambda f: message_sizes(buckets if known else [], f),
        )

    for step in (lambda arm, i: 0.8 if arm.fusion_bytes == 4 << 20 else 1.0, lambda a, i: 1.0):
        c = search(known=True)
        c.start(None)
        c.screened([])
        drive(c, step, 80)
        # 1 MiB makes DDP's own 3 messages; 16 MiB makes 4 MiB's one, whether it won or lost.
        assert [a.fusion_bytes for _, a, _ in c.history] == [4 << 20]
        assert c.settled
    c = search(known=False)  # before the buckets are known, every size is tested
    c.start(None)
    c.screened([])
    drive(c, lambda arm, i: 1.0, 120)
    # 1 and 4 MiB together (4 MiB's test, second in their order, ends an iteration sooner).
    assert [a.fusion_bytes for _, a, _ in c.history] == [4 << 20, 1 << 20, 16 << 20]


def test_message_sizes_follow_the_engines_fusion_and_pieces() -> None:
    mib = 1 << 20
    half, big = mib // 2, 7 * mib // 2
    buckets = [(half, "float32"), (half, "float32"), (big, "float32")]
    assert message_sizes(buckets, 0) == buckets_bytes(buckets)
    assert message_sizes(buckets, mib) == [mib, *[big // 4] * 4]  # fused, then cut in 4
    assert message_sizes(buckets, 4 * mib) == [mib, big]  # 4.5 MiB would not fit
    assert message_sizes(buckets, 16 * mib) == [2 * half + big]
    # Another dtype, and a sparse bucket, end a fusion.
    mixed = [(mib // 2, "float32"), (mib // 4, "float16"), (8, "float32 torch.sparse_coo")]
    assert message_sizes([*mixed, (mib // 2, "float32")], 4 * mib) == [
        mib // 2,
        mib // 4,
        8,
        mib // 2,
    ]


def buckets_bytes(buckets: list[tuple[int, str]]) -> list[int]:
    return [n for n, _ in buckets]


def test_the_fusion_sizes_meet_the_classes_winner_with_its_choices(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The example's MLP on one node: fused into one 4 MiB message it is a little faster on the
    baseline's all-reduce (ahead on the median, not beyond noise), and much faster once that
    message runs the algorithm screening found fastest on DDP's own 1 MiB messages. The fusion
    size meets the incumbent after the class tests, the class it makes taking the choice of the
    nearest class the incumbent runs; where none won, it meets the baseline's all-reduce, and if
    it came close, meets the incumbent again with screening's choice."""
    mib = 1 << 20
    buckets = [(mib, "float32")] * 3  # DDP's: three 1 MiB messages; fused at 4 MiB, one of 3 MiB
    fused, tree_on_ddp = Arm((), 4 * mib), Arm(((mib, TREE),), 0)
    carried = Arm(((mib, TREE), (4 * mib, TREE)), 4 * mib)
    carried_alone = Arm(((4 * mib, TREE),), 4 * mib)  # where the 1 MiB class kept the baseline
    tree_fused = Arm(((mib, TREE),), 4 * mib)  # what fusing tree_on_ddp is, messages unknown

    def run(fused_alone: float, tree_alone: float = 0.9, known: bool = True) -> PlanSearch:
        c = PlanSearch(
            Arm(),
            fusion_options=(0, 4 * mib),
            max_pairs=8,
            warmup=0,
            recheck_every=0,
            messages=lambda f: message_sizes(buckets if known else [], f),
        )
        c.start(None)
        swing = [1.08, 0.92, 0.98, 1.02]  # around ``fused_alone``: never beyond noise at 0.96
        k = [0]

        def step(arm: Arm, i: int) -> float:
            if arm == fused:
                k[0] += 1
                return fused_alone * swing[k[0] % 4]
            return {tree_on_ddp: tree_alone, carried: 0.7, carried_alone: 0.7}.get(arm, 1.0)

        assert c.phase == "screening" and c.incumbent == Arm()
        c.screened([(mib, TREE, 0.001)])
        drive(c, step, 200)
        assert c.settled
        return c

    def tests(c: PlanSearch) -> list[tuple[str, Arm, bool]]:
        return [(k, a, o.challenger_won) for k, a, o in c.history]

    # The class won: the fusion size meets it with the 1 MiB class's tree carried to 4 MiB.
    assert tests(run(0.96)) == [
        ("class", tree_on_ddp, True),
        ("fusion", carried, True),
        ("confirm", carried, True),
    ]
    # The class's tree lost on DDP's buckets: the fusion size meets the baseline's all-reduce,
    # comes close, and meets it again with screening's choice carried (on one 4 MiB message it
    # may pay where on three 1 MiB ones it did not).
    caplog.set_level(logging.INFO, logger="autotune")
    c = run(0.96, tree_alone=1.0)
    assert tests(c) == [
        ("class", tree_on_ddp, False),
        ("fusion", fused, False),  # ahead on the median, not proven
        ("fusion", carried_alone, True),
    ]
    assert c.incumbent == carried_alone and c.gain is not None  # won against the baseline
    # The log tells each paired test's end before what it leads to.
    said = [" ".join(r.getMessage().split()[:3]) for r in caplog.records]
    assert said == [
        "autotune class paired",
        "autotune fusion paired",
        "autotune tries fusion",  # fusion 4 MiB again, with algorithms: 4 MiB: tree, ...
        "autotune fusion paired",
    ]
    # Behind on the median but within noise, it is met again all the same (where fusing alone
    # is within noise, ahead or behind is a coin's toss).
    assert tests(run(1.01, tree_alone=1.0))[2] == ("fusion", carried_alone, True)
    # One slower beyond noise is not met again: the baseline is kept.
    c = run(1.2, tree_alone=1.0)
    assert [k for k, _, _ in c.history] == ["class", "fusion"] and c.baseline_kept
    # Messages not known: nothing is carried (the fused plan keeps the classes' choices), and
    # the class's win was against the baseline: locked without a confirmation.
    c = run(0.96, known=False)
    assert tests(c) == [("class", tree_on_ddp, True), ("fusion", tree_fused, False)]
    assert c.incumbent == tree_on_ddp


def test_a_job_resumed_before_its_fusion_size_met_again_meets_it_as_the_first_would_have() -> None:
    """A short job ended after a fusion size came close, before its second meeting had ended:
    the near miss is what it stores (`PlanSearch.fusion_near`, until that meeting has ended),
    and the job that resumes it (`PlanSearch.resume`) screens from the studies, runs the class
    tests against the plan that had won so far, then meets the fusion size again."""
    mib = 1 << 20
    buckets = [(mib, "float32")] * 3  # DDP's: three 1 MiB messages; fused at 4 MiB, one of 3 MiB
    fused, tree_on_ddp = Arm((), 4 * mib), Arm(((mib, TREE),), 0)
    carried = Arm(((mib, TREE), (4 * mib, TREE)), 4 * mib)
    carried_alone = Arm(((4 * mib, TREE),), 4 * mib)
    swing = [1.08, 0.92, 0.98, 1.02]  # around 0.96: ahead on the median, never beyond noise
    k = [0]

    def step(arm: Arm, i: int) -> float:
        if arm == fused:
            k[0] += 1
            return 0.96 * swing[k[0] % 4]
        return {tree_on_ddp: 0.9, carried: 0.7, carried_alone: 0.7}.get(arm, 1.0)

    def search() -> PlanSearch:
        return PlanSearch(
            Arm(),
            fusion_options=(0, 4 * mib),
            max_pairs=8,
            warmup=0,
            recheck_every=0,
            catch=True,
            messages=lambda f: message_sizes(buckets, f),
        )

    # The short job: its class lost, the fusion size came close on the baseline's all-reduce,
    # and the job ends during its second meeting.
    first = search()
    first.start(None)
    first.screened([(mib, TREE, 0.001)])
    end = 0
    while first.match is None or first.match.challenger != carried_alone:
        end = drive(first, lambda arm, i: 1.0 if arm == tree_on_ddp else step(arm, i), 1, end)
        assert end < 200
    near = first.fusion_near  # the job ends here: stored as its lead
    assert near is not None and near.arm == fused and 0.9 < near.gain.ratio < 1.0
    assert near.gain.high >= 1.0  # lost: not beyond noise
    assert first.fused  # every fusion size has met the incumbent: the next job meets none

    def tests(c: PlanSearch) -> list[tuple[str, Arm, bool]]:
        return [(k, a, o.challenger_won) for k, a, o in c.history]

    # None had won: screening, the class tests, then the fusion size with the class's choice.
    c = search()
    c.resume(None, None, near)
    assert c.phase == "screening" and not c.history and c.fusion_near == near
    c.screened([(mib, TREE, 0.001)])
    drive(c, step, 60)
    assert tests(c) == [("class", tree_on_ddp, True), ("fusion", carried, True)]
    assert c.phase == "catch" and c.incumbent == carried and c.fusion_near is None

    # A plan had won (on DDP's buckets): it is the incumbent the class tests and the fusion
    # size meet, kept until that test ends (a job ending during it stores it again).
    c = search()
    c.resume(tree_on_ddp, Gain(0.9, 0.85, 0.95, 10), near)
    assert c.phase == "screening" and c.incumbent == tree_on_ddp
    c.screened([])  # its class is locked on its winner: nothing to shortlist
    assert c.match is not None and c.match.kind == "fusion"
    assert c.match.reference == tree_on_ddp and c.match.challenger == carried
    assert c.fusion_near == near
    drive(c, step, 60)
    assert tests(c) == [("fusion", carried, True)]
    assert c.phase == "catch" and c.incumbent == carried and c.fusion_near is None
    # A fusion-only plan had won, with its gain against the baseline: the class tests it had
    # left run against it, and it is locked without another confirmation if none wins.
    c = search()
    c.resume(fused, Gain(0.9, 0.85, 0.95, 10), None)
    c.screened([(4 * mib, TREE, 0.001)])
    assert c.match is not None and c.match.reference == fused
    drive(c, lambda arm, i: 1.0, 60)
    assert tests(c) == [("class", carried_alone, False)]
    assert c.settled and c.incumbent == fused and c.gain == Gain(0.9, 0.85, 0.95, 10)


def test_a_near_miss_whose_messages_would_run_as_they_lost_is_not_met_again() -> None:
    """DDP's six 512 KiB buckets: fused at 1 MiB, three messages, at 4 MiB one of 3 MiB. The
    class's tree wins, and both fusion sizes meet it with tree carried; 1 MiB comes close, 4
    MiB wins. Met again, 1 MiB's messages would take tree, as they did: it is not."""
    kib, mib = 1 << 10, 1 << 20
    buckets = [(512 * kib, "float32")] * 6
    tree_on_ddp = Arm(((512 * kib, TREE),), 0)
    near_plan = Arm(((512 * kib, TREE), (mib, TREE)), mib)
    fused = Arm(((512 * kib, TREE), (4 * mib, TREE)), 4 * mib)
    swing = [1.08, 0.92, 0.98, 1.02]
    k = [0]

    def step(arm: Arm, i: int) -> float:
        if arm == near_plan:  # around 0.99x tree's: ahead on the median, never beyond noise
            k[0] += 1
            return 0.9 * 0.99 * swing[k[0] % 4]
        return {tree_on_ddp: 0.9, fused: 0.7}.get(arm, 1.0)

    c = PlanSearch(
        Arm(),
        fusion_options=(0, mib, 4 * mib),
        max_pairs=8,
        warmup=0,
        recheck_every=0,
        messages=lambda f: message_sizes(buckets, f),
    )
    c.start(None)
    c.screened([(512 * kib, TREE, 0.001)])
    drive(c, step, 200)
    assert c.settled and c.incumbent == fused
    assert [(k, a, o.challenger_won) for k, a, o in c.history] == [
        ("class", tree_on_ddp, True),
        ("fusion", fused, True),  # the two met it together; 4 MiB decided first
        ("fusion", near_plan, False),
        ("confirm", fused, True),
    ]


def test_a_choice_carried_to_a_class_that_cannot_run_it_runs_its_algorithm_unsegmented() -> None:
    """tree in 1 MiB segments won on DDP's one 2 MiB bucket; cut at 1 MiB, its messages fall in
    the 1 MiB class, whose space has no 1 MiB segment (a segment below the class only): it runs
    tree unsegmented. Carried as it was, the plan named a choice outside the class's space, and
    the ranks failed to encode it ("... is not in list")."""
    mib = 1 << 20
    tree_seg = Choice("tree", mib)
    won = Arm(((2 * mib, tree_seg),), 0)
    c = PlanSearch(
        Arm(),
        fusion_options=(0, mib),
        max_pairs=8,
        warmup=0,
        recheck_every=0,
        messages=lambda f: message_sizes([(2 * mib, "float32")], f),
        space=lambda cls: search_space(cls, ("native", "tree")),
    )
    assert tree_seg not in search_space(mib, ("native", "tree"))
    c.start(None)
    c.screened([(2 * mib, tree_seg, 0.001)])
    end = 0
    while c.phase == "classes":
        end = drive(c, lambda arm, i: 0.8 if arm == won else 1.0, 1, end)
    assert c.incumbent == won and c.match is not None and c.match.kind == "fusion"
    assert c.match.challenger == Arm(((mib, TREE), (2 * mib, tree_seg)), mib)
