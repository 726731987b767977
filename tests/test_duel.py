"""The paired comparison and the plan-level campaign, driven with known step times."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from autotune.plan import Arm, Choice, Gain, Lead
from autotune.tuning.campaign import (
    LEAD_BELOW,
    NOMINATE_BELOW,
    RUNNER_UP_WITHIN,
    Campaign,
    nominate,
)
from autotune.tuning.duel import (
    FUTILE_FROM,
    MIN_PAIRS,
    PROMISING,
    Duel,
    Outcome,
    hodges_lehmann,
    median_interval,
    signed_rank_interval,
)


def test_median_interval_is_the_sign_tests_order_statistics() -> None:
    # n = 6: P(X <= 0) = 1/64 <= 0.025 < P(X <= 1) = 7/64, so k = 1: the extremes.
    assert median_interval([5, 1, 4, 2, 6, 3]) == (1, 6)
    # n = 20: P(X <= 5) = 0.0207 <= 0.025 < P(X <= 6) = 0.0577, so k = 6.
    values = list(range(1, 21))
    assert median_interval(values) == (6, 15)
    # Five values cannot exclude anything at 95%: P(X = 0) = 1/32 > 0.025.
    assert median_interval([1, 2, 3, 4, 5]) == (0.0, math.inf)
    # Past 1023 values (2.0**n overflows a float): still exact, and where the normal
    # approximation puts it, n/2 - 1.96 sqrt(n)/2 (956.2 at n = 2000), within one value.
    for n in (1024, 2000):
        low, high = median_interval(list(range(1, n + 1)))
        assert abs(low - (n / 2 - 1.96 * math.sqrt(n) / 2)) < 1 and high == n + 1 - low


def run(duel: Duel, step: dict[bool, float], noise: float = 0.0, seed: int = 0) -> int:
    """Feed the duel its schedule with the given steps until it decides; the pairs it took."""
    rng = random.Random(seed)
    for _ in range(1000):
        challenger = duel.schedule()
        if duel.measure(challenger, step[challenger] * (1 + rng.uniform(-noise, noise))):
            break
    assert duel.outcome is not None
    return len(duel.ratios)


def test_the_signed_rank_interval_is_walsh_averages_at_the_tables_critical_values() -> None:
    # Critical values of the signed-rank statistic, two-sided 5% (Hollander & Wolfe): T <= 0
    # at n=6, T <= 8 at n=10, T <= 25 at n=15. The interval is the (T+1)-th smallest and
    # largest of the n(n+1)/2 Walsh averages; of 0..n-1, the averages step by 0.5.
    for n, critical in ((6, 0), (10, 8), (15, 25)):
        values = [float(v) for v in range(n)]
        walsh = sorted((a + b) / 2 for i, a in enumerate(values) for b in values[i:])
        assert signed_rank_interval(values) == (walsh[critical], walsh[-critical - 1])
    assert signed_rank_interval([1.0] * 5) == (0.0, math.inf)
    assert hodges_lehmann([1.0, 2.0, 9.0]) == 3.5  # of the Walsh averages 1 1.5 2 5 5.5 9


def test_with_signed_ranks_a_gain_the_sign_test_cannot_prove_wins() -> None:
    # Block ratios measured on the mlp at 2 ranks (one bucket against 1 MiB buckets). At 12
    # pairs the sign test's upper end is the 10th smallest ratio, 1.00: not beyond noise. The
    # signed-rank interval, which weighs how far below 1 the other nine lie, ends below 1.
    ratios = [1.13, 0.98, 1.04, 0.86, 0.81, 0.89, 0.82, 1.00, 0.77, 0.95, 0.97, 0.90]
    outcomes = {}
    for signed in (False, True):
        duel = Duel(12, warmup=0, signed_rank=signed)
        for r in ratios:
            duel.measure(False, 1.0)
            outcome = duel.measure(True, r)
        assert outcome is not None
        outcomes[signed] = outcome
    assert outcomes[True].challenger_won and outcomes[True].gain.high < 1.0
    assert outcomes[True].gain.ratio == pytest.approx(0.921, abs=0.001)
    assert not outcomes[False].challenger_won and outcomes[False].gain.high == 1.0


def test_a_faster_challenger_wins_at_the_first_look() -> None:
    duel = Duel(24, warmup=0)
    assert run(duel, {False: 1.0, True: 0.8}) == MIN_PAIRS
    assert duel.outcome is not None and duel.outcome.challenger_won
    assert duel.outcome.gain.ratio == pytest.approx(0.8)


def cycle(duel: Duel, factors: list[float]) -> int:
    """The challenger's steps at ``factors`` (in turn) of the incumbent's 1.0, until decided."""
    k = 0
    while duel.outcome is None:
        challenger = duel.schedule()
        duel.measure(challenger, factors[k % len(factors)] if challenger else 1.0)
        k += challenger
    return len(duel.ratios)


def test_a_challenger_barely_ahead_loses_at_the_pair_budget() -> None:
    # Ahead on the median (0.98), but a third of its pairs are behind: never beyond noise. Not
    # promising enough to be extended either.
    for extend_to in (None, 48):
        duel = Duel(24, warmup=0, extend_to=extend_to)
        assert cycle(duel, [0.97, 0.98, 1.01]) == 24
        assert duel.outcome is not None and not duel.outcome.challenger_won
        assert duel.outcome.why == "not faster beyond noise"


def test_a_promising_challenger_gets_more_pairs_and_wins_where_its_gain_is_real() -> None:
    # Two pairs in three ahead by 10-15%, one behind: at 24 pairs the interval still reaches 1
    # (16 below it, the sign test's bound is the 18th smallest), the median is 0.9.
    factors = [0.85, 0.9, 1.02]
    duel = Duel(24, warmup=0)
    assert cycle(duel, factors) == 24
    assert duel.outcome is not None and not duel.outcome.challenger_won
    assert duel.outcome.gain.ratio == pytest.approx(0.9) and duel.outcome.gain.ratio <= PROMISING
    # Given the room, the same evidence goes on and wins before twice the pairs.
    duel = Duel(24, warmup=0, extend_to=48)
    pairs = cycle(duel, factors)
    assert 24 < pairs <= 48 and (pairs - MIN_PAIRS) % 4 == 0
    assert duel.outcome is not None and duel.outcome.challenger_won
    assert duel.outcome.why == "faster beyond noise" and duel.outcome.gain.high < 1.0


def test_an_extended_duel_the_challenger_cannot_win_ends_at_its_limit() -> None:
    # Three pairs in five ahead (median 0.9), two behind: never beyond noise, however long.
    duel = Duel(24, warmup=0, extend_to=48)
    assert cycle(duel, [0.8, 0.9, 1.1, 1.05, 0.85]) == 48
    assert duel.outcome is not None and not duel.outcome.challenger_won
    assert duel.outcome.why == "not faster beyond noise"
    with pytest.raises(ValueError, match="extend_to"):
        Duel(24, extend_to=12)


def test_a_re_check_keeps_a_challenger_still_ahead_and_drops_one_that_is_not() -> None:
    # The restart's duel of the mlp's stored 4 MiB buckets at 2 ranks, as measured: ahead on
    # the median, the interval still reaching 1. A first duel loses it (the gain is not proven
    # again); a re-check of a size proven before keeps it, at the pair budget, unextended.
    ratios = [1.16, 0.84, 0.97, 1.02, 0.88, 0.93, 1.05, 0.90, 0.99, 0.86, 1.08, 0.91]
    for hold in (False, True):
        duel = Duel(12, warmup=0, signed_rank=True, hold=hold)
        for r in ratios:
            duel.measure(False, 1.0)
            outcome = duel.measure(True, r)
        assert outcome is not None and len(duel.ratios) == 12
        assert outcome.gain.ratio < 1.0 and outcome.gain.low < 1.0 < outcome.gain.high
        assert outcome.challenger_won is hold
        assert outcome.why == ("ahead on the median" if hold else "not faster beyond noise")
    # Behind on the median, a re-check loses, judged at its budget only (no futility look at
    # FUTILE_FROM pairs, as a first duel has); slower beyond noise, at once.
    duel = Duel(12, warmup=0, hold=True)
    assert cycle(duel, [1.01, 1.02, 0.99]) == 12
    assert duel.outcome is not None and not duel.outcome.challenger_won
    assert duel.outcome.why == "not ahead on the median"
    duel = Duel(12, warmup=0, hold=True)
    assert run(duel, {False: 1.0, True: 1.3}) == MIN_PAIRS
    assert duel.outcome is not None and duel.outcome.why == "slower beyond noise"


def test_a_re_check_not_ahead_at_its_budget_is_judged_again_on_all_its_pairs() -> None:
    # Its first 12 pairs: 1.05x and 0.97x by turns, behind on the median but not beyond noise.
    # Then 0.90x and 0.99x by turns: over all 24 pairs, ahead on the median: kept, at 24 and
    # not before (no look in between judges the median).
    factors = [1.05, 0.97] * 6 + [0.90, 0.99] * 6
    duel = Duel(12, warmup=0, extend_to=24, signed_rank=True, hold=True)
    assert cycle(duel, factors) == 24
    assert duel.outcome is not None and duel.outcome.challenger_won
    assert duel.outcome.why == "ahead on the median" and duel.outcome.gain.high > 1.0
    # Judged at 12 alone, the same pairs lose it.
    duel = Duel(12, warmup=0, signed_rank=True, hold=True)
    assert cycle(duel, factors) == 12 and duel.outcome is not None
    assert not duel.outcome.challenger_won and duel.outcome.gain.ratio > 1.0
    # Still behind after 24, within noise: dropped.
    duel = Duel(12, warmup=0, extend_to=24, signed_rank=True, hold=True)
    assert cycle(duel, [1.06, 0.96, 1.02]) == 24
    assert duel.outcome is not None and not duel.outcome.challenger_won
    assert duel.outcome.why == "not ahead on the median"


def test_a_challenger_behind_on_the_median_stops_at_the_second_look() -> None:
    duel = Duel(24, warmup=0)
    assert cycle(duel, [1.01, 1.02, 0.99]) == FUTILE_FROM
    assert duel.outcome is not None and duel.outcome.why == "not ahead on the median"


def test_a_slower_challenger_loses_early_and_a_far_slower_one_at_once() -> None:
    duel = Duel(24, warmup=0)
    assert run(duel, {False: 1.0, True: 1.3}) == MIN_PAIRS
    assert duel.outcome is not None and duel.outcome.why == "slower beyond noise"
    duel = Duel(24, warmup=0)
    assert run(duel, {False: 1.0, True: 5.0}) == 1


def test_the_schedule_is_abba_and_warmup_and_repeats_are_not_paired() -> None:
    duel = Duel(24, warmup=1)
    assert [duel.schedule() for _ in range(8)] == [False, True, True, False] * 2
    duel.measure(False, 9.0)  # warm-up: dropped
    duel.measure(True, 9.0)  # warm-up: dropped
    duel.measure(True, 2.0)
    duel.measure(True, 3.0)  # replaces its unpaired neighbour
    duel.measure(False, 1.5)
    assert duel.ratios == [2.0]


def test_drift_cancels_in_the_pairs() -> None:
    # The machine slows down 3x over the duel; the challenger is 10% faster throughout.
    duel = Duel(24, warmup=0)
    k = 0
    while duel.outcome is None:
        challenger = duel.schedule()
        drift = 1.0 + 2.0 * k / 50
        duel.measure(challenger, (0.9 if challenger else 1.0) * drift)
        k += 1
    assert duel.outcome.challenger_won


FUSION = (0, 1 << 20)
TREE = Choice("tree")


def campaign(recheck_every: int = 0, catch: bool = False) -> Campaign:
    return Campaign(
        Arm(),
        fusion_options=FUSION,
        max_pairs=8,
        warmup=0,
        recheck_every=recheck_every,
        catch=catch,
    )


def drive(c: Campaign, step_of: object, iterations: int, start: int = 0) -> int:
    """Run ``iterations`` scheduled iterations (each measured as it runs); the last one."""
    assert callable(step_of)
    for i in range(start, start + iterations):
        arm = c.next_arm(c.incumbent.with_class(1 << 20, TREE) if c.phase == "screening" else None)
        c.measure(arm, step_of(arm, i))
        c.tick(i)
    return start + iterations


def test_a_plan_is_locked_only_after_beating_the_baseline_on_the_step() -> None:
    c = campaign()
    c.start(None)
    assert c.phase == "fusion"

    def step(arm: Arm, i: int) -> float:
        return 0.8 if arm.choice(1 << 20) == TREE else 1.0  # fusion changes nothing

    drive(c, step, 40)
    assert c.phase == "screening"
    c.screened([(1 << 20, TREE, 0.001)])
    drive(c, step, 40)
    assert c.settled and c.incumbent == Arm(((1 << 20, TREE),), 0)
    assert c.gain is not None and c.gain.ratio == pytest.approx(0.8)


def test_latency_alone_never_locks_a_plan_whose_step_is_slower() -> None:
    c = campaign()
    c.start(None)
    drive(c, lambda arm, i: 1.0, 40)
    # Screening found TREE much faster per message, but it burns the step.
    c.screened([(1 << 20, TREE, 0.5)])
    drive(c, lambda arm, i: 1.2 if arm.choice(1 << 20) == TREE else 1.0, 40)
    assert c.settled and c.baseline_kept and c.gain is None


def test_a_stored_plan_is_confirmed_against_the_baseline_or_dropped() -> None:
    stored = Arm(((1 << 20, TREE),), 1 << 20)
    c = campaign()
    c.start(stored)
    assert c.phase == "confirm"
    drive(c, lambda arm, i: 1.1 if arm == stored else 1.0, 40)
    assert c.baseline_kept
    c = campaign()
    c.start(stored)
    drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 40)
    assert c.settled and c.incumbent == stored


def test_search_duels_may_be_extended_and_re_checks_may_not() -> None:
    stored = Arm(((1 << 20, TREE),), 0)
    c = campaign(recheck_every=30)
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
    c = campaign(recheck_every=30)
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


def test_screening_nominates_the_fastest_and_a_close_runner_up_of_another_algorithm() -> None:
    # Clear winner: only it. The next algorithm is 1.3x slower than the winner.
    assert nominate({NATIVE: 10.0, RING: 5.0, HRING: 6.5}, NATIVE) == [(RING, 5.0)]
    # Within RUNNER_UP_WITHIN of the winner: both, the winner first, each with what it saves.
    close = 5.0 * RUNNER_UP_WITHIN * 0.99
    got = nominate({NATIVE: 10.0, RING: 5.0, HRING: close}, NATIVE)
    assert [c for c, _ in got] == [RING, HRING]
    assert [saved for _, saved in got] == pytest.approx([5.0, 10.0 - close])
    # Another segment of the winner's algorithm is not a runner-up; the next algorithm is.
    ring_seg = Choice("ring", 1 << 18)
    got = nominate({NATIVE: 10.0, RING: 5.0, ring_seg: 5.01, HRING: 5.2}, NATIVE)
    assert [c for c, _ in got] == [RING, HRING]


def test_a_runner_up_must_beat_what_the_class_runs_by_the_same_bar() -> None:
    # The runner-up is close to the winner but not NOMINATE_BELOW of the current latency.
    now_s = 10.0
    best = NOMINATE_BELOW * now_s * 0.99
    runner = NOMINATE_BELOW * now_s * 1.01
    assert runner <= RUNNER_UP_WITHIN * best
    got = nominate({NATIVE: now_s, RING: best, HRING: runner}, NATIVE)
    assert [c for c, _ in got] == [RING] and got[0][1] == pytest.approx(now_s - best)
    # The class already runs the fastest: nothing, not even a close runner-up.
    assert nominate({NATIVE: 5.0, RING: 5.1}, NATIVE) == []
    assert nominate({}, NATIVE) == []
    # The current choice was not measured (another job's study): the winner, saving measured
    # against itself, and its runner-up.
    assert [c for c, _ in nominate({RING: 5.0, HRING: 5.2}, NATIVE)] == [RING, HRING]


def test_when_the_latency_winner_loses_on_the_step_its_runner_up_gets_its_own_duel() -> None:
    cls = 2 << 20
    c = campaign()
    c.start(None)
    drive(c, lambda arm, i: 1.0, 40)
    assert c.phase == "screening"
    c.screened(
        [
            (cls, choice, saved)
            for choice, saved in nominate({NATIVE: 10.0, RING: 8.0, HRING: 8.4}, NATIVE)
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
    # Without the runner-up rule it would have kept the baseline: the same campaign with the
    # latency winner only.
    c = campaign()
    c.start(None)
    drive(c, lambda arm, i: 1.0, 40)
    c.screened([(cls, RING, 2.0)])
    drive(c, step, 200)
    assert c.settled and c.baseline_kept


def test_a_re_check_lost_within_noise_looks_again_before_falling_back() -> None:
    stored = Arm(((1 << 20, TREE),), 0)

    def run(noisy_then: float) -> Campaign:
        """Locked on ``stored`` (0.9x); at the first re-check its steps alternate 0.85x and
        1.2x (a median above 1, but not slower beyond noise); then ``noisy_then``."""
        c = campaign(recheck_every=30)
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

    def run(alone: float) -> Campaign:
        """Each class's hierarchical ring makes the step ``alone`` times the baseline's; the
        challenger's steps swing by -8% to +8% around that, the same way every time."""
        c = Campaign(Arm(), fusion_options=(0,), max_pairs=8, warmup=0, recheck_every=0)
        c.start(None)
        swing = [1.08, 0.92, 0.98, 1.02]  # median 1: a pair above 1 in four at alone = 0.96
        k = [0]

        def step(arm: Arm, i: int) -> float:
            if arm == Arm():
                return 1.0
            k[0] += 1
            on = sum(arm.choice(cls) == HRING for cls in (small, large))
            return alone**on * swing[k[0] % 4]

        assert c.phase == "screening"
        c.screened([(small, HRING, 0.002), (large, HRING, 0.001)])
        drive(c, step, 200)
        return c

    c = run(0.96)
    kinds = [(k, o.challenger_won, round(o.gain.ratio, 2)) for k, _, o in c.history]
    # Each alone: ahead on the median, not beyond noise at 8 pairs. Together: 0.92, won.
    assert kinds[:2] == [("class", False, 0.96), ("class", False, 0.96)]
    assert kinds[2][:2] == ("combined", True)
    assert c.settled and c.incumbent == Arm(((small, HRING), (large, HRING)), 0)
    assert c.gain is not None and c.gain.ratio == pytest.approx(0.96**2 * 0.98, rel=0.05)
    # Challengers not ahead on the median are not combined: the baseline is kept.
    c = run(1.01)
    assert [k for k, _, _ in c.history] == ["class", "class"]
    assert c.settled and c.baseline_kept


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

    def first_job(alone: float) -> Campaign:
        c = campaign()
        c.start(None)
        drive(c, swinging(alone, fused), 40)
        assert c.phase == "screening"
        c.screened([])
        assert c.settled and c.baseline_kept
        return c

    # Fusion at 0.96x, not beyond noise: the baseline is kept, and fusion is its lead.
    c = first_job(0.96)
    assert [(k, o.challenger_won) for k, _, o in c.history] == [("fusion", False)]
    assert c.lead is not None and c.lead.arm == fused
    assert c.lead.gain == c.history[0][2].gain and c.lead.gain.ratio == pytest.approx(0.96)
    # At 0.99x (the noise of cells with nothing to gain) nothing is remembered.
    assert LEAD_BELOW < 0.99 and first_job(0.99).lead is None
    lead = c.lead

    # The next job from that table: one duel of the lead against the baseline first.
    nxt = campaign()
    nxt.start(Arm(), lead)
    assert nxt.phase == "confirm" and nxt.match is not None and nxt.match.kind == "retry"
    assert (nxt.match.reference, nxt.match.challenger) == (Arm(), fused)
    drive(nxt, lambda arm, i: 0.9 if arm == fused else 1.0, 40)
    assert nxt.settled and nxt.incumbent == fused and nxt.lead is None
    assert nxt.gain is not None and nxt.gain.ratio == pytest.approx(0.9)
    # Lost again, even close: the baseline, and the lead is forgotten (one retry per lead).
    nxt = campaign()
    nxt.start(Arm(), lead)
    drive(nxt, swinging(0.96, fused), 40)
    assert nxt.settled and nxt.baseline_kept and nxt.lead is None
    assert [k for k, _, _ in nxt.history] == ["retry"]
    # Without a lead a stored baseline locks at once, as before.
    nxt = campaign()
    nxt.start(Arm())
    assert nxt.settled and nxt.baseline_kept and nxt.match is None


def test_the_lead_is_the_closest_challenger_and_a_won_plan_has_none() -> None:
    cls = 2 << 20
    tree = Arm(((cls, TREE),), 0)
    c = campaign()
    c.start(None)
    step = swinging(0.96, Arm((), 1 << 20))
    drive(c, step, 40)
    c.screened([(cls, TREE, 0.001)])
    drive(c, swinging(0.955, tree), 80)
    assert c.settled and c.baseline_kept
    assert [(k, round(o.gain.ratio, 3)) for k, _, o in c.history] == [
        ("fusion", 0.96),
        ("class", 0.955),
    ]
    assert c.lead is not None and c.lead.arm == tree
    # A round that locks a plan leaves no lead, whatever came close before it won.
    c = campaign()
    c.start(None)
    drive(c, step, 40)
    c.screened([(cls, TREE, 0.001)])
    drive(c, lambda arm, i: 0.8 if arm == tree else 1.0, 80)
    assert c.settled and c.incumbent == tree and c.lead is None


def test_where_the_job_steps_aside_a_plan_that_needs_the_hook_meets_plain_ddp_first() -> None:
    tree = Arm(((1 << 20, TREE),), 0)

    def won_by_tree(catch: bool) -> Campaign:
        c = campaign(recheck_every=30, catch=catch)
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

    # Kept: locked, its gain the catch's against plain DDP, which later re-checks (against
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

    # Lost: the baseline is kept, with no lead; the verdict's history ends with the catch.
    c = won_by_tree(catch=True)
    c.caught(False, Outcome(False, Gain(1.04, 0.99, 1.1, 24), "not ahead on the median"))
    assert c.settled and c.baseline_kept and c.gain is None and c.lead is None
    assert [k for k, _, _ in c.history][-1] == "catch"
    c.caught(True, None)  # a stale word after the catch changes nothing
    assert c.baseline_kept

    # Not run (the reducer cannot be rebuilt): locked on the duels' word.
    c = won_by_tree(catch=True)
    c.caught(True, None)
    assert c.settled and c.incumbent == tree and c.gain == hooked_gain and not c.against_plain


def test_a_fusion_only_plan_has_no_catch_and_a_stored_hook_plan_goes_straight_to_it() -> None:
    fused = Arm((), 1 << 20)
    c = campaign(catch=True)
    c.start(None)
    drive(c, lambda arm, i: 0.8 if arm == fused else 1.0, 40)
    c.screened([])
    drive(c, lambda arm, i: 0.8 if arm == fused else 1.0, 40)
    assert c.settled and c.incumbent == fused  # DDP runs it: its bucket duels say the rest
    # A stored plan that needs the hook: the catch, instead of a confirm against the hooked
    # baseline; without the catch, the confirm.
    stored = Arm(((1 << 20, TREE),), 0)
    c = campaign(catch=True)
    c.start(stored)
    assert c.phase == "catch" and c.incumbent == stored and c.match is None and not c.history
    c = campaign(catch=True)
    c.start(fused)
    assert c.phase == "confirm" and c.match is not None
    # A stored lead that needs the hook: its retry against the hooked baseline, then the catch.
    c = campaign(catch=True)
    c.start(Arm(), Lead(stored, Gain(0.96, 0.9, 1.02, 10)))
    assert c.match is not None and c.match.kind == "retry"
    drive(c, lambda arm, i: 0.9 if arm == stored else 1.0, 40)
    assert c.phase == "catch" and c.incumbent == stored
