"""The plain verdict a job's summary leads with (`Status.headline`), one per situation, never
contradicting whether autotune stepped aside."""

from __future__ import annotations

import math

import pytest

from autotune.plan import Gain
from autotune.tuning.status import Status


def status(**changes: object) -> Status:
    base: dict[str, object] = dict(
        tuning=True, phase="screen", plan_locked=False, settled=False, locked=False, gain=None,
        unhooked_at=None, verdict="",
    )  # fmt: skip
    base.update(changes)
    return Status(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "headline"),
    [
        ({"tuning": False, "phase": "fixed"}, "a fixed plan: not compared with plain DDP"),
        (
            {"gain": Gain(0.72, 0.62, 0.84, 6), "plan_locked": True, "phase": "locked"},
            "0.72x step time: faster with autotune",
        ),
        (
            {"unhooked_at": 460, "plan_locked": True, "phase": "locked"},
            "no gain: plain DDP kept, autotune stepped aside after iteration 460",
        ),
        # Stepped aside wins over a gain measured before (never "faster" and "stepped aside").
        (
            {"unhooked_at": 460, "gain": Gain(0.98, 0.9, math.inf, 6)},
            "no gain: plain DDP kept, autotune stepped aside after iteration 460",
        ),
        ({"plan_locked": True, "phase": "locked"}, "no gain: plain DDP's all-reduce kept"),
        ({"gain": Gain(1.03, 0.98, 1.09, 6)}, "no gain: plain DDP's all-reduce kept"),
        ({}, "not decided yet: still tuning (the plan so far is stored; run longer or again)"),
    ],
)
def test_the_headline_says_what_the_job_got(changes: dict[str, object], headline: str) -> None:
    assert status(**changes).headline == headline
