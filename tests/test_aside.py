"""Stepping aside: once the tuner keeps the baseline, DDP runs its own all-reduce without the hook.

Each job trains autotune's model beside plain DDP on the same batches (tests/aside_jobs.py), with
a tuner that can only keep the baseline; from the iteration it steps aside on, the hook is no
longer called, and the parameters stay DDP's: bitwise at 2 ranks (the baseline's lane is bitwise
DDP's too), to rounding beyond.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aside_jobs import KEEPS_BASELINE, Aside, beside_plain

from autotune.launch import run_local

STEPS = 40
#: Jobs that should step aside train until every rank has, and this many synced steps after,
#: up to `CAP` steps.
AFTER = 10
CAP = 400


def config(tmp_path: Path, **more: object) -> dict[str, object]:
    return {**KEEPS_BASELINE, "storage": f"sqlite:///{tmp_path / 'tuning.db'}", **more}


def check_stepped_aside(runs: list[Aside]) -> None:
    at = {r.aside_at for r in runs}
    assert len(at) == 1 and None not in at, [(r.aside_at, r.refused) for r in runs]
    (aside_at,) = at
    assert aside_at is not None
    for r in runs:
        # One bucket an iteration: a call in each of the first aside_at synced steps, then none.
        seen, expected = 0, []
        for synced in r.synced:
            expected.append(1 if synced and seen < aside_at else 0)
            seen += synced
        assert r.calls == expected, (r.calls, r.synced)
        assert seen >= aside_at + AFTER, "too few steps after stepping aside to check them"
        assert r.reducer_replaced and r.hooks_left == 0
        if len(runs) == 2:
            assert r.hooked == r.plain, "the model that stepped aside left plain DDP's training"
        else:
            # The new reducer's first iteration runs DDP's initial bucket layout, as plain DDP's
            # first did: gloo's ring adds an element's terms in an order that depends on where
            # it lies in the bucket, so that iteration rounds differently beyond 2 ranks.
            assert r.plain_rel < 1e-5, r.plain_rel
    assert len({r.hooked for r in runs}) == 1, "ranks' parameters diverged"
    assert "stepped aside after iteration" in runs[0].verdict, runs[0].verdict


@pytest.mark.parametrize(
    "variant",
    ["base", "static_graph", "gradient_as_bucket_view", "find_unused_parameters", "no_sync"],
)
def test_once_the_baseline_is_locked_ddp_runs_on_without_the_hook(
    tmp_path: Path, variant: str
) -> None:
    runs = run_local(
        beside_plain, 2, variant, CAP, "register", config(tmp_path), None, AFTER, timeout_s=600
    )
    check_stepped_aside(runs)
    assert "no plan was put forward against it" in runs[0].verdict, runs[0].verdict


def test_the_state_finds_its_model_when_registered_by_the_one_line_api(tmp_path: Path) -> None:
    # ddp_model.register_comm_hook(state, autotune.hook): the state is not told its model.
    settings = config(tmp_path, metrics_port=0)
    runs = run_local(beside_plain, 3, "base", CAP, "one_line", settings, None, AFTER, timeout_s=600)
    check_stepped_aside(runs)
    assert [r.stepped_aside_gauge for r in runs] == [1.0] * 3


def test_a_job_restarted_on_a_stored_baseline_steps_aside_within_a_few_steps(
    tmp_path: Path,
) -> None:
    args = ("base", CAP, "register", config(tmp_path), None, AFTER)
    first = run_local(beside_plain, 2, *args, timeout_s=600)
    again = run_local(beside_plain, 2, *args, timeout_s=600)
    check_stepped_aside(again)
    assert again[0].aside_at < first[0].aside_at  # nothing screened again
    assert "as the stored plan says" in again[0].verdict, again[0].verdict


def test_with_step_aside_off_the_hook_runs_to_the_end(tmp_path: Path) -> None:
    runs = run_local(
        beside_plain, 2, "base", STEPS, "register", config(tmp_path, step_aside=False),
        timeout_s=300,
    )  # fmt: skip
    for r in runs:
        assert r.aside_at is None and r.refused is None
        assert r.calls == [1] * STEPS and not r.reducer_replaced and r.hooks_left == 1
        assert r.hooked == r.plain


@pytest.mark.parametrize("broken", ["missing", "raises"])
def test_where_the_reducer_cannot_be_rebuilt_the_hook_stays_and_says_why(
    tmp_path: Path, broken: str
) -> None:
    runs = run_local(
        beside_plain, 2, "base", STEPS, "register", config(tmp_path), broken, timeout_s=300
    )
    for r in runs:
        assert r.aside_at is None
        assert r.refused is not None
        expected = "_build_debug_param_to_name_mapping" if broken == "missing" else "injected"
        assert expected in r.refused, r.refused
        # The old reducer and its hook go on; a half-built new one reduces nothing.
        assert r.calls == [1] * STEPS, r.calls
        assert not r.reducer_replaced and r.hooks_left == 1
        assert r.hooked == r.plain
