"""A paired test under way (`autotune.tuning.match`): one challenger in the paired test's own
order, or two sharing the reference's iterations."""

from __future__ import annotations

import pytest

from autotune.plan import Arm
from autotune.tuning.match import Match, Rival
from autotune.tuning.paired_test import PairedTest

A, B1, B2 = Arm(), Arm((), 1 << 20), Arm((), 4 << 20)
STEP = {A: 1.0, B1: 1.2, B2: 0.8}  # B1 slower, B2 faster, every step alike


def match(*challengers: Arm, warmup: int = 0) -> Match:
    rivals = [Rival(c, PairedTest(8, warmup=warmup, extend_to=16)) for c in challengers]
    return Match(A, rivals, "fusion")


def test_two_challengers_take_turns_beside_one_reference_each_neighbouring_both() -> None:
    m = match(B1, B2)
    order = [m.next_arm() for _ in range(12)]
    assert order == [B1, A, B2, B2, A, B1] * 2
    # Every reference iteration is next to one of each challenger's.
    for i, arm in enumerate(order):
        if arm == A:
            assert {order[i - 1], order[i + 1]} == {B1, B2}


def test_two_tests_of_six_pairs_take_nine_iterations_each_not_twelve() -> None:
    """Both decided at the first look (6 pairs), in 18 iterations where one after the other
    would take 24; each test's pairs are its challenger's step over its neighbouring
    reference's, so the ratios are exact."""
    m = match(B1, B2)
    ended = []
    iterations = 0
    while not m.over:
        arm = m.next_arm()
        iterations += 1
        ended += m.measure(arm, STEP[arm])
    assert iterations == 18
    assert m.ended == ended  # the match keeps every test that ended, in order
    outcomes = dict(ended)
    assert not outcomes[B1].challenger_won and outcomes[B1].gain.ratio == pytest.approx(1.2)
    assert outcomes[B2].challenger_won and outcomes[B2].gain.ratio == pytest.approx(0.8)
    assert outcomes[B1].gain.pairs == outcomes[B2].gain.pairs == 6


def test_once_one_test_ends_the_other_goes_on_alone_in_its_own_order() -> None:
    """B1 at 1.2x loses at the first look; B2, equal to the reference, goes on alone, A B B A,
    to its 8 pairs (its most: not faster beyond noise, not promising enough to extend)."""
    m = match(B1, B2, warmup=1)
    step = {A: 1.0, B1: 1.2, B2: 1.0}
    order, ends = [], []
    while not m.over:
        arm = m.next_arm()
        order.append(arm)
        ends += [(len(order), c, o) for c, o in m.measure(arm, step[arm])]
    (at_b1, b1, lost), (at_b2, b2, held) = ends
    assert (b1, b2) == (B1, B2) and not lost.challenger_won and not held.challenger_won
    assert (lost.gain.pairs, held.gain.pairs) == (6, 8)
    # B1's pairs end at iterations 6, 8, 12, 14, 18 and 20 (its first and the reference's first
    # neighbouring it are warm-up): 20 iterations, where alone it would take 2 + 12.
    assert at_b1 == 20
    alone = order[at_b1:]
    # Alone, B2 first completes the pair the reference's last iteration began, then A B B A.
    assert B1 not in alone and alone == ([B2, B2, A, A] * 4)[: len(alone)]
    assert m.measurements_left() == 0 and at_b2 == len(order)


def test_a_step_from_before_the_match_is_dropped_and_the_left_is_counted_with_sharing() -> None:
    m = match(B1, B2)
    assert m.measure(Arm((), 16 << 20), 5.0) == []
    # 8 pairs each, alone 16 iterations each; together the reference's are shared.
    assert m.measurements_left() == 16 + 16 // 2
    single = match(B1)
    assert single.measurements_left() == 16
    assert [single.next_arm() for _ in range(4)] == [A, B1, B1, A]
    with pytest.raises(ValueError, match="one or two challengers"):
        Match(A, [], "fusion")
