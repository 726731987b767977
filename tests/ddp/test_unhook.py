"""Unhooking: once the tuner keeps the baseline, DDP runs its own all-reduce without the hook.

Each job trains autotune's model beside plain DDP on the same batches (tests/jobs/unhook_jobs.py),
with a tuner that can only keep the baseline; from the iteration it unhooks on, the hook is no
longer called, and the parameters stay DDP's: bitwise at 2 ranks (the baseline's lane is bitwise
DDP's too), to rounding beyond.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from headlines import assert_never_claims_early
from unhook_jobs import KEEPS_BASELINE, Aside, beside_plain

from autotune.comm.launch import run_local
from autotune.plan import Buckets, Gain, Table
from autotune.storage import Store
from autotune.util.units import format_bytes

pytestmark = pytest.mark.distributed

STEPS = 40
#: Jobs that should unhook train until every rank has, and this many synced steps after,
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
        assert seen >= aside_at + AFTER, "too few steps after unhooking to check them"
        assert r.reducer_replaced and r.hooks_left == 0
        assert r.old_name == (True, True)  # state.aside, deprecated, for one release
        if len(runs) == 2:
            assert r.hooked == r.plain, "the model that unhooked left plain DDP's training"
        else:
            # The new reducer's first iteration runs DDP's initial bucket layout, as plain DDP's
            # first did: gloo's ring adds an element's terms in an order that depends on where
            # it lies in the bucket, so that iteration rounds differently beyond 2 ranks.
            assert r.plain_rel < 1e-5, r.plain_rel
    assert len({r.hooked for r in runs}) == 1, "ranks' parameters diverged"
    assert "unhooked after iteration" in runs[0].verdict, runs[0].verdict


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
    assert [r.unhooked_gauge for r in runs] == [1.0] * 3
    # The old name, for one release, says the same.
    assert [r.stepped_aside_gauge for r in runs] == [1.0] * 3


def test_a_job_restarted_on_a_stored_baseline_steps_aside_within_a_few_steps(
    tmp_path: Path,
) -> None:
    args = ("base", CAP, "register", config(tmp_path), None, AFTER)
    run_local(beside_plain, 2, *args, timeout_s=600)
    store = Store(str(config(tmp_path)["storage"]))
    trials = store.trial_count()
    assert trials > 0  # the first job screened
    again = run_local(beside_plain, 2, *args, timeout_s=600)
    check_stepped_aside(again)
    # Nothing screened again (how many iterations the load takes depends on the machine's load).
    assert store.trial_count() == trials
    assert "as the stored plan says" in again[0].verdict, again[0].verdict


def test_with_unhook_off_the_hook_runs_to_the_end(tmp_path: Path) -> None:
    runs = run_local(
        beside_plain, 2, "base", STEPS, "register", config(tmp_path, unhook=False),
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


#: A tuner that keeps the backend's all-reduce, the fusion size its own, with short paired tests;
#: the model in DDP buckets of about 2 KB, so DDP's bucket size has a layout to change (one bucket).
TUNES_BUCKETS = {**KEEPS_BASELINE, "fusion_bytes": None, "max_pairs": 6}
SMALL_BUCKETS = int(0.002 * 2**20)  # bucket_cap_mb=0.002, as DDP turns it into bytes
#: The smallest of autotune.tuning.buckets.LADDER: the model's 23 KB in one bucket. The one
#: challenger is this, or the fusion size the tuner kept (tried first), which makes the same layout.
ONE_BUCKET = 1 << 20


def one_challenger(r: Aside, won: bool) -> int:
    """The one bucket size ``r``'s search tried (one bucket for the whole model), which won or
    lost its paired test as ``won`` says."""
    assert r.bucket_duels is not None and len(r.bucket_duels) == 1, r.bucket_duels
    ((cap, result),) = r.bucket_duels
    assert cap >= ONE_BUCKET and result == won, r.bucket_duels
    return cap


def test_once_aside_ddp_keeps_the_bucket_size_that_makes_the_step_faster(
    tmp_path: Path,
) -> None:
    # The job's own small buckets are slowed: the one-bucket layout wins its paired test, is kept by
    # every rank's reducer, stored, and confirmed at once by the next job.
    args = ("small_buckets", CAP, "register", config(tmp_path, **TUNES_BUCKETS), None, 1)
    first = run_local(beside_plain, 2, *args, "reference", timeout_s=600)
    cap = one_challenger(first[0], won=True)
    for r in first:
        assert r.aside_at is not None, r.refused
        assert one_challenger(r, won=True) == cap
        assert r.bucket_kept == cap and r.bucket_cap == cap
    assert f"in {format_bytes(cap)} buckets" in first[0].verdict, first[0].verdict
    assert first[0].verdict.startswith("autotune vs plain DDP: 0."), first[0].verdict
    # Provisional while the bucket sizes are compared; final with the verdict's own figure.
    for r in first:
        assert_never_claims_early(r.headlines)
        assert any("still to run: DDP's bucket-size search" in h for h in r.headlines)
        ratio = first[0].verdict.removeprefix("autotune vs plain DDP: ").split("x ")[0]
        assert r.headlines[-1].startswith(f"{ratio}x step time: faster with autotune (DDP's own")
    assert len({r.hooked for r in first}) == 1, "ranks' parameters diverged"
    # Another bucket layout sums the same gradients in another order: DDP's training to 1e-5.
    assert first[0].plain_rel < 1e-5, first[0].plain_rel
    stored = first[0].stored_buckets
    assert stored is not None and stored["bucket_bytes"] == cap, stored
    assert stored["gain"]["ratio"] < 1.0 and stored["gain"]["pairs"] >= 6, stored

    again = run_local(beside_plain, 2, *args, "reference", timeout_s=600)
    for r in again:
        assert r.bucket_duels == [(cap, True)] and r.bucket_cap == cap  # the stored size
    assert again[0].stored_buckets is not None


def test_once_aside_ddp_keeps_the_job_s_buckets_when_no_size_beats_them(tmp_path: Path) -> None:
    args = ("small_buckets", CAP, "register", config(tmp_path, **TUNES_BUCKETS), None, 1)
    runs = run_local(beside_plain, 2, *args, "others", timeout_s=600)
    for r in runs:
        assert r.aside_at is not None, r.refused
        one_challenger(r, won=False)
        assert r.bucket_kept == SMALL_BUCKETS and r.bucket_cap == SMALL_BUCKETS
        assert r.hooked == r.plain  # back on the job's own layout: plain DDP's training
    assert "no bucket size beat them" in runs[0].verdict, runs[0].verdict
    assert runs[0].stored_buckets == {"bucket_bytes": SMALL_BUCKETS, "gain": None}
    # The next job keeps the stored verdict: the job's own buckets, nothing tested again.
    again = run_local(beside_plain, 2, *args, "others", timeout_s=600)
    for r in again:
        assert r.bucket_duels == [] and r.bucket_cap == SMALL_BUCKETS
    assert "as the stored plan says" in again[0].verdict, again[0].verdict
    # Had the size come close, it would be the stored lead: the next job tests it alone once
    # more, and here (the job's own slowed now) it wins and is kept by every rank.
    cap = one_challenger(runs[0], won=False)
    store = Store(str(config(tmp_path)["storage"]), run_id="seeded")
    ((key, table),) = store.tables().items()
    lead = Buckets(cap, Gain(0.96, 0.9, 1.02, 6))
    store.save_table(*key, dataclasses.replace(table, buckets=Buckets(SMALL_BUCKETS, None, lead)))
    retried = run_local(beside_plain, 2, *args, "reference", timeout_s=600)
    for r in retried:
        assert r.bucket_duels == [(cap, True)] and r.bucket_kept == cap and r.bucket_cap == cap
    stored = retried[0].stored_buckets
    assert stored is not None and stored["bucket_bytes"] == cap and "lead" not in stored, stored


def test_a_plan_file_that_keeps_ddp_s_bucket_size_steps_aside_onto_it(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    kept = Buckets(ONE_BUCKET, Gain(0.85, 0.8, 0.9, 12))
    plan.write_text(json.dumps(Table({}, 0, buckets=kept).to_json()))
    settings = {"plan_file": str(plan)}
    runs = run_local(
        beside_plain, 2, "small_buckets", CAP, "register", settings, None, AFTER, timeout_s=300
    )
    for r in runs:
        assert r.aside_at == 1 and r.bucket_cap == ONE_BUCKET, (r.aside_at, r.refused)
        assert r.calls[:2] == [1, 0] and r.hooks_left == 0
    assert "the plan file's buckets" in runs[0].verdict, runs[0].verdict
    assert runs[0].plain_rel < 1e-5, runs[0].plain_rel
