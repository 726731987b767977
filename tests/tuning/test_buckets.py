"""DDP's bucket size, searched once autotune has unhooked: which sizes are tried, and the
search's verdicts from given block steps (the same numbers give the same verdict on every rank).
The search on real ranks, rebuilding DDP's reducer, is in tests/ddp/test_unhook.py."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from autotune.plan import Buckets, Choice, Entry, Gain, Table
from autotune.tuning.buckets import MAX_PAIRS, BucketSearch, bucket_test, challengers
from autotune.tuning.paired_test import PairedTest

MIB = 1 << 20


@pytest.mark.parametrize(
    ("reference", "total", "first", "first_bucket", "expected"),
    [
        # The example's mlp: 3.4 MB in 1 MiB buckets; the next size up makes one bucket.
        (MIB, 3_400_000, None, None, [4 * MIB]),
        # The tuner kept fusion 16 MiB: tried first, and 4 MiB is the same layout.
        (MIB, 3_400_000, 16 * MIB, None, [16 * MIB]),
        # DDP's default (25 MiB, a 1 MiB first bucket) on 12 MB: the next size down.
        (25 * MIB, 12_000_000, None, MIB, [4 * MIB]),
        # ... on 1.5 MB: 1 MiB buckets are the default's own layout; nothing to try.
        (25 * MIB, 1_500_000, None, MIB, []),
        # 25 MiB for every bucket on a large model: both neighbours.
        (25 * MIB, 1 << 30, None, None, [64 * MIB, 16 * MIB]),
        # Gradients smaller than every bucket already: nothing to try.
        (25 * MIB, 500_000, None, None, []),
    ],
)
def test_the_sizes_tried_are_the_neighbours_that_change_the_layout(
    reference: int, total: int, first: int | None, first_bucket: int | None, expected: list[int]
) -> None:
    assert challengers(reference, total, first, first_bucket) == expected


def run(
    search: BucketSearch, step_of: dict[int, float] | Callable[[int], float], limit: int = 500
) -> list[int]:
    """Feed the search each block's step by the cap it ran; the caps run, in order."""
    step = step_of if callable(step_of) else step_of.__getitem__
    ran = []
    while (cap := search.cap()) is not None:
        ran.append(cap)
        search.block(step(cap))
        assert len(ran) < limit, "the search did not end"
    return ran


def test_a_faster_size_wins_its_duel_in_a_b_b_a_blocks_and_is_kept() -> None:
    search = BucketSearch(MIB, [4 * MIB])
    ran = run(search, {MIB: 0.010, 4 * MIB: 0.008})
    assert ran[:8] == [MIB, 4 * MIB, 4 * MIB, MIB] * 2
    assert len(ran) == 12  # 6 pairs, every one ahead: the interval's upper end is below 1
    assert search.kept == 4 * MIB
    result = search.result()
    assert result is not None and result.bucket_bytes == 4 * MIB and result.gain is not None
    assert result.gain.ratio == pytest.approx(0.8) and result.gain.pairs == 6
    assert search.pairs == 6


def test_a_slower_size_loses_and_the_job_s_own_stays() -> None:
    search = BucketSearch(MIB, [4 * MIB, 16 * MIB])
    run(search, {MIB: 0.010, 4 * MIB: 0.012, 16 * MIB: 0.011})
    assert [(cap, o.challenger_won) for cap, o in search.history] == [
        (4 * MIB, False),
        (16 * MIB, False),
    ]
    assert search.kept == MIB and search.result() == Buckets(MIB, None)


def test_of_two_sizes_that_win_the_faster_is_kept() -> None:
    search = BucketSearch(MIB, [4 * MIB, 16 * MIB])
    run(search, {MIB: 0.010, 4 * MIB: 0.009, 16 * MIB: 0.007})
    assert [o.challenger_won for _, o in search.history] == [True, True]
    assert search.kept == 16 * MIB
    result = search.result()
    assert result is not None and result.gain is not None
    assert result.gain.ratio == pytest.approx(0.7)


def alternating(low: float, high: float) -> Callable[[int], float]:
    """Block steps: 10 ms for the job's own 1 MiB, and for any other size ``low`` and ``high``
    times that in turn, so its pairs of blocks measure the two ratios by turns."""
    seen: dict[int, int] = {}

    def step(cap: int) -> float:
        n = seen[cap] = seen.get(cap, 0) + 1
        return 0.010 if cap == MIB else 0.010 * (low if n % 2 else high)

    return step


def test_a_size_ahead_but_not_proven_at_its_pairs_goes_on_to_twice_as_many() -> None:
    # Pairs at 0.92x and 1.02x by turns: 0.97x on the median, within noise at 12 pairs, beyond
    # it at 24. A hooked paired test extends only from 0.95x (PROMISING), and loses at 12.
    search = BucketSearch(MIB, [4 * MIB])
    run(search, alternating(0.92, 1.02))
    ((_, outcome),) = search.history
    assert outcome.challenger_won and outcome.gain.pairs == 2 * MAX_PAIRS
    assert outcome.gain.ratio == pytest.approx(math.sqrt(0.92 * 1.02)) and outcome.gain.high < 1
    hooked = PairedTest(MAX_PAIRS, warmup=0, extend_to=2 * MAX_PAIRS, signed_rank=True)
    for k in range(2 * MAX_PAIRS):
        hooked.measure(False, 1.0)
        if hooked.measure(True, 0.92 if k % 2 == 0 else 1.02):
            break
    assert hooked.outcome is not None and not hooked.outcome.challenger_won
    assert hooked.outcome.gain.pairs == MAX_PAIRS


def test_blocks_of_single_steps_are_judged_on_the_sign_test_not_the_signed_rank() -> None:
    """Two pairs of ten behind, eight well ahead: Wilcoxon's interval, which reads how far each
    pair is ahead, calls it faster beyond noise at 10 pairs; the sign test, which counts only
    which side each pair is on, does not (its upper end is the 9th ratio, 1.05). Single steps'
    long tails are what the sign test is for (`autotune.tuning.plain_check`: blocks of one)."""
    ratios = [1.05, 0.7, 0.7, 1.05, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
    tests = {signed_rank: bucket_test(signed_rank=signed_rank) for signed_rank in (True, False)}
    for test in tests.values():
        for r in ratios:
            test.measure(False, 1.0)
            test.measure(True, r)
    won = tests[True].outcome
    assert won is not None and won.challenger_won
    assert won.gain.pairs == 10 and won.gain.high < 1.0
    assert tests[False].outcome is None  # undecided at 10 pairs: on to the next look
    assert tests[False].gain() == Gain(0.7, 0.7, 1.05, 10)


def test_a_stored_size_is_tried_first_and_if_it_wins_nothing_else_is() -> None:
    search = BucketSearch(MIB, [4 * MIB, 16 * MIB], stored=16 * MIB)
    run(search, {MIB: 0.010, 4 * MIB: 0.005, 16 * MIB: 0.008})
    assert [cap for cap, _ in search.history] == [16 * MIB]
    assert search.kept == 16 * MIB


def test_a_stored_size_that_loses_leaves_the_others_to_try() -> None:
    search = BucketSearch(MIB, [4 * MIB, 16 * MIB], stored=16 * MIB)
    run(search, {MIB: 0.010, 4 * MIB: 0.008, 16 * MIB: 0.012})
    assert [(cap, o.challenger_won) for cap, o in search.history] == [
        (16 * MIB, False),
        (4 * MIB, True),
    ]
    assert search.kept == 4 * MIB


def test_a_stored_size_still_ahead_within_noise_is_kept_without_a_second_proof() -> None:
    # Blocks alternate 1.04x and 0.88x of the reference: ahead on the median, never beyond
    # noise. A stored size is re-checked, not proven again: kept at the 6-pair budget, and no
    # other size is tried. The same blocks for a size no job kept lose it (at 12 pairs).
    search = BucketSearch(MIB, [4 * MIB, 16 * MIB], stored=16 * MIB, max_pairs=6)
    run(search, alternating(1.04, 0.88))
    assert [(cap, o.challenger_won, o.gain.pairs) for cap, o in search.history] == [
        (16 * MIB, True, 6)
    ]
    assert search.kept == 16 * MIB
    result = search.result()
    assert result is not None and result.gain is not None and result.gain.high > 1.0
    search = BucketSearch(MIB, [16 * MIB], max_pairs=6)
    run(search, alternating(1.04, 0.88))
    assert [(o.challenger_won, o.gain.pairs) for _, o in search.history] == [(False, 12)]
    assert search.kept == MIB
    # ... ahead by more than 3% on the median: the job's own is kept with 16 MiB as its lead.
    ((_, lost),) = search.history
    assert lost.gain.ratio == pytest.approx(math.exp((math.log(0.88) + math.log(1.04)) / 2))
    assert search.result() == Buckets(MIB, None, Buckets(16 * MIB, lost.gain))


def test_a_stored_size_behind_at_its_pairs_is_judged_again_on_twice_as_many() -> None:
    # The stored 16 MiB's first 12 pairs of blocks: 1.05x and 0.97x by turns, behind on the
    # median; its next 12: 0.90x and 0.99x. A re-check judged at 12 pairs would drop it and
    # try 4 MiB; it goes on to 24, is ahead on the median of them all, and stays.
    factors = [1.05, 0.97] * (MAX_PAIRS // 2) + [0.90, 0.99] * (MAX_PAIRS // 2)
    seen = [0]

    def step(cap: int) -> float:
        if cap == MIB:
            return 0.010
        seen[0] += 1
        return 0.010 * factors[(seen[0] - 1) % len(factors)]

    search = BucketSearch(MIB, [4 * MIB, 16 * MIB], stored=16 * MIB)
    run(search, step)
    ((cap, outcome),) = search.history
    assert (cap, outcome.challenger_won, outcome.gain.pairs) == (16 * MIB, True, 2 * MAX_PAIRS)
    assert outcome.why == "ahead on the median" and search.kept == 16 * MIB


def test_the_lead_alone_is_dueled_again_and_kept_if_it_wins_or_forgotten() -> None:
    candidates = [4 * MIB, 16 * MIB]
    search = BucketSearch(MIB, candidates, lead=16 * MIB)
    run(search, {MIB: 0.010, 4 * MIB: 0.005, 16 * MIB: 0.008})
    assert [(cap, o.challenger_won) for cap, o in search.history] == [(16 * MIB, True)]
    assert search.kept == 16 * MIB
    search = BucketSearch(MIB, candidates, lead=16 * MIB)
    run(search, {MIB: 0.010, 4 * MIB: 0.005, 16 * MIB: 0.0102})
    ((cap, outcome),) = search.history
    assert cap == 16 * MIB and not outcome.challenger_won
    # Lost: the job's own, and no lead again (a retry leaves none), 4 MiB never tried.
    assert search.kept == MIB and search.result() == Buckets(MIB, None)
    # A stored size goes first; a lead is only for a job whose own size was kept.
    search = BucketSearch(MIB, candidates, stored=4 * MIB, lead=16 * MIB)
    run(search, {MIB: 0.010, 4 * MIB: 0.008, 16 * MIB: 0.007})
    assert [cap for cap, _ in search.history] == [4 * MIB]


def test_with_nothing_to_try_the_search_is_over_at_once() -> None:
    search = BucketSearch(MIB, [])
    assert search.cap() is None and search.kept == MIB and search.result() == Buckets(MIB, None)


@pytest.mark.parametrize(
    ("as_stored", "why"),
    [
        (True, "as the stored plan says"),
        # A first job whose neighbouring sizes all make its own layout: nothing was stored, and
        # the verdict said it was.
        (False, "no neighbouring bucket size makes other buckets of them"),
    ],
)
def test_the_verdict_says_why_nothing_was_tested(as_stored: bool, why: str) -> None:
    from types import SimpleNamespace

    from autotune.tuning.status import _verdict

    search = BucketSearch(MIB, [], as_stored=as_stored)
    unhooking = SimpleNamespace(at=40, buckets=SimpleNamespace(search=search, done=True))
    verdict = _verdict(SimpleNamespace(decider=None), unhooking)  # type: ignore[arg-type]
    assert verdict == (
        f"autotune vs plain DDP: 1.00x step time (DDP's own all-reduce on the job's buckets: "
        f"{why}); autotune unhooked after iteration 40: DDP runs its own all-reduce, without "
        "the hook"
    )


def test_the_table_keeps_the_bucket_size_and_refuses_a_bad_one() -> None:
    kept = Buckets(4 * MIB, Gain(0.85, 0.8, 0.9, 12))
    table = Table({}, None, buckets=kept)
    assert Table.from_json(table.to_json()).buckets == kept
    assert "4 MiB (0.85x over 12 pairs of blocks)" in kept.describe()
    own = Buckets(MIB, None)
    assert Table.from_json(Table({}, None, buckets=own).to_json()).buckets == own
    assert "the job's own" in own.describe()
    near = Buckets(MIB, None, Buckets(4 * MIB, Gain(0.96, 0.9, 1.02, 12)))
    assert Table.from_json(Table({}, None, buckets=near).to_json()).buckets == near
    assert "DDP's buckets at 4 MiB (0.96x over 12 pairs of blocks) came close" in near.describe()
    with pytest.raises(ValueError, match="a lead"):
        Buckets(4 * MIB, Gain(0.85, 0.8, 0.9, 12), near.lead)
    with pytest.raises(ValueError, match="a lead"):
        Buckets(MIB, None, Buckets(4 * MIB, None))
    bad = table.to_json()
    bad["buckets"] = {"bucket_bytes": -1, "gain": None}
    with pytest.raises(ValueError, match="buckets: bucket_bytes"):
        Table.from_json(bad)


def test_a_table_keeps_a_bucket_size_only_with_the_backend_s_all_reduce_in_every_class() -> None:
    kept = Buckets(4 * MIB, Gain(0.85, 0.8, 0.9, 12))
    data = Table({MIB: Entry(Choice("tree"))}, None, buckets=kept).to_json()
    with pytest.raises(ValueError, match="every class runs without the hook"):
        Table.from_json(data)
    # An NCCL cell (autotune-nccl) runs without the hook, from NCCL's tuner plugin's table.
    cell = Table({MIB: Entry(Choice("nccl.ring.ll128")), 2 * MIB: Entry(Choice("native"))})
    assert cell.runs_without_hook and not cell.runs_native
    with_size = Table(cell.classes, None, buckets=kept)
    assert Table.from_json(with_size.to_json()) == with_size
