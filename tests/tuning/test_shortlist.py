"""A class's screening puts forward its challengers (`autotune.tuning.shortlist`): the fastest
choice, a close runner-up of another algorithm, and its own algorithm on another wire."""

from __future__ import annotations

import pytest

from autotune.plan import Choice
from autotune.tuning.shortlist import RUNNER_UP_WITHIN, SHORTLIST_BELOW, shortlist

RING, HRING, NATIVE = Choice("ring"), Choice("hierarchical_ring"), Choice("native")


def test_screening_nominates_the_fastest_and_a_close_runner_up_of_another_algorithm() -> None:
    # Clear winner: only it. The next algorithm is 1.3x slower than the winner.
    assert shortlist({NATIVE: 10.0, RING: 5.0, HRING: 6.5}, NATIVE) == [(RING, 5.0)]
    # Within RUNNER_UP_WITHIN of the winner: both, the winner first, each with what it saves.
    close = 5.0 * RUNNER_UP_WITHIN * 0.99
    got = shortlist({NATIVE: 10.0, RING: 5.0, HRING: close}, NATIVE)
    assert [c for c, _ in got] == [RING, HRING]
    assert [saved for _, saved in got] == pytest.approx([5.0, 10.0 - close])
    # Another segment of the winner's algorithm is not a runner-up; the next algorithm is.
    ring_seg = Choice("ring", 1 << 18)
    got = shortlist({NATIVE: 10.0, RING: 5.0, ring_seg: 5.01, HRING: 5.2}, NATIVE)
    assert [c for c, _ in got] == [RING, HRING]


def test_the_same_algorithm_on_another_wire_meets_the_winner_on_the_step_too() -> None:
    # shm+bf16 screens fastest; shm itself, within RUNNER_UP_WITHIN, meets it on the step (on
    # the example's MLP at 4 ranks shm ran 0.62x plain DDP's step, shm+bf16 0.71x).
    shm, shm_bf16 = Choice("shm"), Choice("shm", None, "bf16")
    shm_seg = Choice("shm", 1 << 20, "bf16")
    got = shortlist({NATIVE: 10.0, shm_bf16: 5.0, shm_seg: 5.01, shm: 5.3, RING: 5.2}, NATIVE)
    assert [c for c, _ in got] == [shm_bf16, RING, shm]
    # However far behind it screened (the 16 MiB class of the transformer: shm+bf16 won on
    # latency, and on the step shm beats it); the other way round too; but not unless it
    # passes the first bar against what the class runs.
    got = shortlist({NATIVE: 10.0, shm_bf16: 4.0, shm: 6.0}, NATIVE)
    assert [c for c, _ in got] == [shm_bf16, shm]
    assert [c for c, _ in shortlist({NATIVE: 10.0, shm: 5.0, shm_bf16: 6.0}, NATIVE)] == [
        shm,
        shm_bf16,
    ]
    assert [c for c, _ in shortlist({NATIVE: 10.0, shm: 5.0, shm_bf16: 9.5}, NATIVE)] == [shm]


def test_a_runner_up_must_beat_what_the_class_runs_by_the_same_bar() -> None:
    # The runner-up is close to the winner but not NOMINATE_BELOW of the current latency.
    now_s = 10.0
    best = SHORTLIST_BELOW * now_s * 0.99
    runner = SHORTLIST_BELOW * now_s * 1.01
    assert runner <= RUNNER_UP_WITHIN * best
    got = shortlist({NATIVE: now_s, RING: best, HRING: runner}, NATIVE)
    assert [c for c, _ in got] == [RING] and got[0][1] == pytest.approx(now_s - best)
    # The class already runs the fastest: nothing, not even a close runner-up.
    assert shortlist({NATIVE: 5.0, RING: 5.1}, NATIVE) == []
    assert shortlist({}, NATIVE) == []
    # The current choice was not measured (another job's study): the winner, saving measured
    # against itself, and its runner-up.
    assert [c for c, _ in shortlist({RING: 5.0, HRING: 5.2}, NATIVE)] == [RING, HRING]
