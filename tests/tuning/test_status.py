"""The plain verdict a job's summary leads with (`Status.headline`), one per situation: final or
provisional, never "faster" before the decision is final, never contradicting the verdict's gain
or whether autotune unhooked."""

from __future__ import annotations

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
            "no gain: plain DDP kept, autotune unhooked after iteration 460",
        ),
        # A DDP bucket size that won once autotune unhooked: the same gain the verdict
        # states, never "no gain" beside a verdict below 1.
        (
            {"unhooked_at": 460, "gain": Gain(0.93, 0.88, 0.98, 12)},
            "0.93x step time: faster with autotune (DDP's own all-reduce in autotune's bucket "
            "size; autotune unhooked after iteration 460)",
        ),
        ({"plan_locked": True, "phase": "locked"}, "no gain: plain DDP's all-reduce kept"),
        ({"gain": Gain(1.03, 0.98, 1.09, 6)}, "no gain: plain DDP's all-reduce kept"),
    ],
)
def test_a_final_headline_says_what_the_job_got(changes: dict[str, object], headline: str) -> None:
    assert status(final=True, **changes).headline == headline


@pytest.mark.parametrize(
    ("changes", "headline"),
    [
        # A gain measured through the hook, before the check against plain DDP: not "faster".
        (
            {
                "gain": Gain(0.90, 0.85, 0.95, 12),
                "phase": "catch",
                "to_run": ("the check against plain DDP",),
                "iterations_left": 96,
            },
            "provisional: 0.90x step time so far, not final; still to run: the check against "
            "plain DDP (about 96 iterations for what is known now)",
        ),
        (
            {"to_run": ("loading what earlier jobs stored",)},
            "provisional: still to run: loading what earlier jobs stored",
        ),
        (
            {
                "unhooked_at": 300,
                "to_run": ("DDP's bucket-size search",),
                "iterations_left": 160,
            },
            "provisional: still to run: DDP's bucket-size search (about 160 iterations for what "
            "is known now)",
        ),
    ],
)
def test_a_provisional_headline_says_what_is_left_and_never_faster(
    changes: dict[str, object], headline: str
) -> None:
    now = status(**changes)
    assert now.decision == "provisional"
    assert now.headline == headline


def test_the_decision_names_the_three_cases() -> None:
    assert status(tuning=False).decision == "fixed"
    assert status(final=True).decision == "final"
    assert status().decision == "provisional"


@pytest.mark.parametrize(
    ("unhooks", "phase", "stages"),
    [
        # Where the job may unhook, a plan that needs the hook meets plain DDP instead of the
        # baseline through the hook: the list said the job would run both.
        (
            True,
            "fusion",
            [
                "fusion sizes against the classes' winner on the step",
                "the plan against the baseline on the step (if the plan needs no hook)",
                "the check against plain DDP (if the plan needs the hook)",
                "DDP's bucket-size search (if plain DDP is kept)",
            ],
        ),
        (
            False,
            "classes",
            [
                "paired tests of the shortlisted algorithms on the step",
                "fusion sizes against the classes' winner on the step",
                "the plan against the baseline on the step",
            ],
        ),
        # Under way (a stored near miss tried again), it is not an if.
        (
            True,
            "confirm",
            [
                "the plan against the baseline on the step",
                "the check against plain DDP (if the plan needs the hook)",
                "DDP's bucket-size search (if plain DDP is kept)",
            ],
        ),
    ],
)
def test_what_is_still_to_run_names_only_what_may_run(
    unhooks: bool, phase: str, stages: list[str]
) -> None:
    from types import SimpleNamespace

    from autotune.tuning.status import _still_to_run

    tuner = SimpleNamespace(phase=phase, unhooks=unhooks, to_go=40)
    assert _still_to_run(tuner, None) == (tuple(stages), 40)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("against_plain", "check_steps", "pairs_of", "against"),
    [
        # The paired tests' baseline runs DDP's all-reduce through the hook: a user read such a
        # gain as over plain DDP, and the check against plain DDP then found none.
        (False, 4, "iterations", "; against DDP's all-reduce through autotune's hook"),
        (True, 4, "blocks of 4 timed steps", ""),
        # The check in its smaller blocks, where the plan's gain was clear.
        (True, 1, "blocks of 1 timed step", ""),
    ],
)
def test_the_verdict_says_what_the_gain_was_measured_against(
    against_plain: bool, check_steps: int, pairs_of: str, against: str
) -> None:
    from types import SimpleNamespace

    from autotune.plan import Arm, Choice
    from autotune.tuning.status import tuner_verdict

    plan = Arm(((4 << 20, Choice("shm")),), 0)
    plan_search = SimpleNamespace(
        baseline_kept=False,
        history=[],
        gain=Gain(0.92, 0.85, 0.98, 26),
        against_plain=against_plain,
        check_steps=check_steps,
        incumbent=plan,
        phase="catch",
    )
    tuner = SimpleNamespace(decider=SimpleNamespace(storage_error=None, plan_search=plan_search))
    assert tuner_verdict(tuner) == (  # type: ignore[arg-type]
        f"autotune vs plain DDP: 0.92x step time (26 pairs of {pairs_of}, 95% interval "
        f"0.85-0.98x; plan: 4 MiB: shm{against})"
    )


def test_a_lost_check_names_the_plan_the_next_job_tries_again() -> None:
    """A plan search whose classes' plan beat the baseline, whose fused plan beat that and then
    lost the check against plain DDP: the verdict says so, and names the lead."""
    from types import SimpleNamespace

    from autotune.plan import Arm, Choice
    from autotune.tuning.paired_test import Outcome
    from autotune.tuning.plan_search import PlanSearch
    from autotune.tuning.status import tuner_verdict

    shm = Arm(((4 << 20, Choice("shm")),), 0)
    fused = shm.with_fusion(16 << 20)
    c = PlanSearch(
        Arm(), fusion_options=(0, 16 << 20), max_pairs=8, warmup=0, recheck_every=0, catch=True
    )
    c.start(None)
    c.screened([(4 << 20, Choice("shm"), 0.001)])
    for _ in range(80):
        arm = c.next_arm()
        c.measure(arm, {shm: 0.9, fused: 0.8}.get(arm, 1.0))
    assert c.phase == "catch" and c.incumbent == fused
    c.caught(False, Outcome(False, Gain(0.974, 0.93, 1.01, 24), "not beyond noise"))
    tuner = SimpleNamespace(decider=SimpleNamespace(storage_error=None, plan_search=c))
    assert tuner_verdict(tuner) == (  # type: ignore[arg-type]
        "autotune vs plain DDP: 1.00x step time (DDP's own all-reduce kept: 4 MiB: shm, fusion "
        "16 MiB beat it through the hook, but ran 0.97x over 24 pairs of blocks of 4 timed "
        "steps against plain DDP; the next job gives 4 MiB: shm (0.90x over 6 pairs) one more "
        "paired test)"
    )
