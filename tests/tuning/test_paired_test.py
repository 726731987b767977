"""The paired A/B test (`autotune.tuning.paired_test`), driven with known step times: its intervals,
looks, extensions and re-checks."""

from __future__ import annotations

import math
import random

import pytest

from autotune.plan import Gain
from autotune.tuning.paired_test import (
    FUTILE_FROM,
    MIN_PAIRS,
    PROMISING,
    Outcome,
    PairedTest,
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


def run(duel: PairedTest, step: dict[bool, float], noise: float = 0.0, seed: int = 0) -> int:
    """Feed the paired test its schedule with the given steps until it decides; the pairs it
    took."""
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
        duel = PairedTest(12, warmup=0, signed_rank=signed)
        for r in ratios:
            duel.measure(False, 1.0)
            outcome = duel.measure(True, r)
        assert outcome is not None
        outcomes[signed] = outcome
    assert outcomes[True].challenger_won and outcomes[True].gain.high < 1.0
    assert outcomes[True].gain.ratio == pytest.approx(0.921, abs=0.001)
    assert not outcomes[False].challenger_won and outcomes[False].gain.high == 1.0


def test_a_faster_challenger_wins_at_the_first_look() -> None:
    duel = PairedTest(24, warmup=0)
    assert run(duel, {False: 1.0, True: 0.8}) == MIN_PAIRS
    assert duel.outcome is not None and duel.outcome.challenger_won
    assert duel.outcome.gain.ratio == pytest.approx(0.8)


def cycle(duel: PairedTest, factors: list[float]) -> int:
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
        duel = PairedTest(24, warmup=0, extend_to=extend_to)
        assert cycle(duel, [0.97, 0.98, 1.01]) == 24
        assert duel.outcome is not None and not duel.outcome.challenger_won
        assert duel.outcome.why == "not faster beyond noise"


def test_a_promising_challenger_gets_more_pairs_and_wins_where_its_gain_is_real() -> None:
    # Two pairs in three ahead by 10-15%, one behind: at 24 pairs the interval still reaches 1
    # (16 below it, the sign test's bound is the 18th smallest), the median is 0.9.
    factors = [0.85, 0.9, 1.02]
    duel = PairedTest(24, warmup=0)
    assert cycle(duel, factors) == 24
    assert duel.outcome is not None and not duel.outcome.challenger_won
    assert duel.outcome.gain.ratio == pytest.approx(0.9) and duel.outcome.gain.ratio <= PROMISING
    # Given the room, the same evidence goes on and wins before twice the pairs.
    duel = PairedTest(24, warmup=0, extend_to=48)
    pairs = cycle(duel, factors)
    assert 24 < pairs <= 48 and (pairs - MIN_PAIRS) % 4 == 0
    assert duel.outcome is not None and duel.outcome.challenger_won
    assert duel.outcome.why == "faster beyond noise" and duel.outcome.gain.high < 1.0


def test_an_extended_duel_the_challenger_cannot_win_ends_at_its_limit() -> None:
    # Three pairs in five ahead (median 0.9), two behind: never beyond noise, however long.
    duel = PairedTest(24, warmup=0, extend_to=48)
    assert cycle(duel, [0.8, 0.9, 1.1, 1.05, 0.85]) == 48
    assert duel.outcome is not None and not duel.outcome.challenger_won
    assert duel.outcome.why == "not faster beyond noise"
    with pytest.raises(ValueError, match="extend_to"):
        PairedTest(24, extend_to=12)


def test_a_re_check_keeps_a_challenger_still_ahead_and_drops_one_that_is_not() -> None:
    # The restart's paired test of the mlp's stored 4 MiB buckets at 2 ranks, as measured: ahead on
    # the median, the interval still reaching 1. A first paired test loses it (the gain is not
    # proven again); a re-check of a size proven before keeps it, at the pair budget, unextended.
    ratios = [1.16, 0.84, 0.97, 1.02, 0.88, 0.93, 1.05, 0.90, 0.99, 0.86, 1.08, 0.91]
    for hold in (False, True):
        duel = PairedTest(12, warmup=0, signed_rank=True, hold=hold)
        for r in ratios:
            duel.measure(False, 1.0)
            outcome = duel.measure(True, r)
        assert outcome is not None and len(duel.ratios) == 12
        assert outcome.gain.ratio < 1.0 and outcome.gain.low < 1.0 < outcome.gain.high
        assert outcome.challenger_won is hold
        assert outcome.why == ("ahead on the median" if hold else "not faster beyond noise")
    # Behind on the median, a re-check loses, judged at its budget only (no futility look at
    # FUTILE_FROM pairs, as a first paired test has); slower beyond noise, at once.
    duel = PairedTest(12, warmup=0, hold=True)
    assert cycle(duel, [1.01, 1.02, 0.99]) == 12
    assert duel.outcome is not None and not duel.outcome.challenger_won
    assert duel.outcome.why == "not ahead on the median"
    duel = PairedTest(12, warmup=0, hold=True)
    assert run(duel, {False: 1.0, True: 1.3}) == MIN_PAIRS
    assert duel.outcome is not None and duel.outcome.why == "slower beyond noise"


def test_a_re_check_not_ahead_at_its_budget_is_judged_again_on_all_its_pairs() -> None:
    # Its first 12 pairs: 1.05x and 0.97x by turns, behind on the median but not beyond noise.
    # Then 0.90x and 0.99x by turns: over all 24 pairs, ahead on the median: kept, at 24 and
    # not before (no look in between judges the median).
    factors = [1.05, 0.97] * 6 + [0.90, 0.99] * 6
    duel = PairedTest(12, warmup=0, extend_to=24, signed_rank=True, hold=True)
    assert cycle(duel, factors) == 24
    assert duel.outcome is not None and duel.outcome.challenger_won
    assert duel.outcome.why == "ahead on the median" and duel.outcome.gain.high > 1.0
    # Judged at 12 alone, the same pairs lose it.
    duel = PairedTest(12, warmup=0, signed_rank=True, hold=True)
    assert cycle(duel, factors) == 12 and duel.outcome is not None
    assert not duel.outcome.challenger_won and duel.outcome.gain.ratio > 1.0
    # Still behind after 24, within noise: dropped.
    duel = PairedTest(12, warmup=0, extend_to=24, signed_rank=True, hold=True)
    assert cycle(duel, [1.06, 0.96, 1.02]) == 24
    assert duel.outcome is not None and not duel.outcome.challenger_won
    assert duel.outcome.why == "not ahead on the median"


def test_a_challenger_behind_on_the_median_stops_at_the_second_look() -> None:
    duel = PairedTest(24, warmup=0)
    assert cycle(duel, [1.01, 1.02, 0.99]) == FUTILE_FROM
    assert duel.outcome is not None and duel.outcome.why == "not ahead on the median"


def test_a_slower_challenger_loses_early_and_a_far_slower_one_at_once() -> None:
    duel = PairedTest(24, warmup=0)
    assert run(duel, {False: 1.0, True: 1.3}) == MIN_PAIRS
    assert duel.outcome is not None and duel.outcome.why == "slower beyond noise"
    duel = PairedTest(24, warmup=0)
    assert run(duel, {False: 1.0, True: 5.0}) == 1


def test_the_schedule_is_abba_and_warmup_and_repeats_are_not_paired() -> None:
    duel = PairedTest(24, warmup=1)
    assert [duel.schedule() for _ in range(8)] == [False, True, True, False] * 2
    duel.measure(False, 9.0)  # warm-up: dropped
    duel.measure(True, 9.0)  # warm-up: dropped
    duel.measure(True, 2.0)
    duel.measure(True, 3.0)  # replaces its unpaired neighbour
    duel.measure(False, 1.5)
    assert duel.ratios == [2.0]


def test_drift_cancels_in_the_pairs() -> None:
    # The machine slows down 3x over the paired test; the challenger is 10% faster throughout.
    duel = PairedTest(24, warmup=0)
    k = 0
    while duel.outcome is None:
        challenger = duel.schedule()
        drift = 1.0 + 2.0 * k / 50
        duel.measure(challenger, (0.9 if challenger else 1.0) * drift)
        k += 1
    assert duel.outcome.challenger_won


def test_how_the_log_words_an_outcome() -> None:
    ahead, behind = Gain(0.97, 0.9, 1.02, 24), Gain(1.02, 0.97, 1.08, 24)
    assert Outcome(True, ahead, "").word("class") == "won"
    assert Outcome(False, behind, "").word("class") == "lost"
    # A re-check the locked plan does not prove but stays ahead in: it holds.
    assert Outcome(False, ahead, "").word("recheck") == "held"
    assert Outcome(False, behind, "").word("recheck") == "lost"
