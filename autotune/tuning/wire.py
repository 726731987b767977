"""The tuner's cross-rank exchange: one float64 row per rank, all-reduced with MAX.

Every rank writes its window's measurements; rank 0 also writes its orders, where the other
ranks write zeros, so the MAX carries rank 0's orders to everyone (`write`, `read`, `Orders`,
`Window`).

- The step: the MAX over ranks (the slowest rank sets DDP's pace). Unmeasured: -1.
- A size class's message latency: the MIN over ranks of each rank's fastest message, written
  negated so that the MAX takes it: what the message costs once every rank is there, without
  the arrival skew of ranks that share cores. What a choice costs the step beyond its message
  neither figure shows; the paired tests on the step decide. Unmeasured: -inf.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.plan import Gain, size_class
from autotune.tuning.blocks import BLOCK_STEPS

__all__ = ["EXPLORING", "LOCKED", "PHASES", "WIDTH", "Orders", "Window", "read", "write"]

CLASSES = 48  # size classes 2^0 .. 2^47 bytes
_LAT = 0  # per class: the window's least message latency, negated
_STEP = _LAT + CLASSES  # the window's median step
_CODE = _STEP + 1  # per class: 0 the baseline choice, k the class's k-th option (from 1)
_STATE = _CODE + CLASSES  # per class: EXPLORING or LOCKED
_FUSION = _STATE + CLASSES  # fusion bytes + 1
_CADENCE = _FUSION + 1  # 0: no orders yet
_PHASE = _CADENCE + 1
_GAIN = _PHASE + 1  # ratio, low, high, pairs
_FROZEN = _GAIN + 4  # 1: tuning stopped, its storage failed (rank 0 says why in its log)
_TO_GO = _FROZEN + 1  # iterations left, as rank 0 estimates them, + 1 (0: not known)
_CHECK = _TO_GO + 1  # timed steps per block of the check against plain DDP (0: the default's)
WIDTH = _CHECK + 1
_UNMEASURED = float("-inf")

EXPLORING, LOCKED = 1, 2
#: The plan search's phases, coded from 1 on the wire.
PHASES = ("loading", "fusion", "screening", "classes", "confirm", "catch", "locked")


@dataclass
class Window:
    """What a rank measured over one window; once exchanged, over every rank (module doc)."""

    latencies: dict[int, float]  # size class -> its fastest message's seconds (then MIN over ranks)
    step_s: float | None


@dataclass
class Orders:
    """Rank 0's orders: the plan every rank runs next, and where tuning stands."""

    codes: dict[int, int]  # size class -> option code (see _CODE); classes not listed: 0
    states: dict[int, str]  # size class -> "exploring" or "locked"
    fusion_bytes: int
    cadence: int
    phase: str
    gain: Gain | None
    #: Tuning stopped for good (the storage failed): the plan runs on as it is, on every rank.
    frozen: bool = False
    #: Iterations before the plan is locked, for the stages known now, as rank 0 estimates them
    #: (`autotune.tuning.plan_search.PlanSearch.iterations_left`; None: not known yet).
    to_go: int | None = None
    #: Timed steps per block of the check against plain DDP, where the plan goes to it
    #: (`autotune.tuning.blocks.check_steps_for`).
    check_steps: int = BLOCK_STEPS


def write(window: Window, orders: Orders | None) -> list[float]:
    """One rank's row: its window, and rank 0's orders (None elsewhere)."""
    row = [_UNMEASURED] * CLASSES + [-1.0] + [0.0] * (WIDTH - _STEP - 1)
    for cls, seconds in window.latencies.items():
        row[_LAT + _index(cls)] = -seconds
    if window.step_s is not None:
        row[_STEP] = window.step_s
    if orders is not None:
        for cls, code in orders.codes.items():
            row[_CODE + _index(cls)] = code
        for cls, state in orders.states.items():
            row[_STATE + _index(cls)] = LOCKED if state == "locked" else EXPLORING
        row[_FUSION] = orders.fusion_bytes + 1
        row[_CADENCE] = orders.cadence
        row[_PHASE] = PHASES.index(orders.phase) + 1
        if orders.gain is not None:
            g = orders.gain
            row[_GAIN : _GAIN + 4] = [g.ratio, g.low, g.high, g.pairs]
        row[_FROZEN] = float(orders.frozen)
        row[_TO_GO] = 0.0 if orders.to_go is None else orders.to_go + 1.0
        row[_CHECK] = orders.check_steps
    return row


def read(row: list[float]) -> tuple[Window, Orders | None]:
    """The exchanged row: everyone's window, and rank 0's orders if it gave any."""
    latencies = {1 << i: -v for i, v in enumerate(row[_LAT : _LAT + CLASSES]) if v != _UNMEASURED}
    window = Window(latencies, row[_STEP] if row[_STEP] >= 0 else None)
    if not row[_CADENCE]:
        return window, None
    codes = {1 << i: int(v) for i, v in enumerate(row[_CODE : _CODE + CLASSES]) if v}
    states = {
        1 << i: "locked" if int(v) == LOCKED else "exploring"
        for i, v in enumerate(row[_STATE : _STATE + CLASSES])
        if v
    }
    ratio, low, high, pairs = row[_GAIN : _GAIN + 4]
    gain = Gain(ratio, low, high, int(pairs)) if pairs > 0 else None
    phase = PHASES[int(row[_PHASE]) - 1]
    fusion, cadence, frozen = int(row[_FUSION]) - 1, int(row[_CADENCE]), bool(row[_FROZEN])
    to_go = int(row[_TO_GO]) - 1 if row[_TO_GO] else None
    check_steps = int(row[_CHECK]) or BLOCK_STEPS
    return window, Orders(codes, states, fusion, cadence, phase, gain, frozen, to_go, check_steps)


def _index(cls: int) -> int:
    assert cls == size_class(cls)
    return cls.bit_length() - 1
