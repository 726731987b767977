"""The check against plain DDP on real ranks: a plan that needs the hook meets plain DDP before it
is locked.

Each job trains autotune's model beside plain DDP on the same batches (tests/jobs/unhook_jobs.py),
from a storage that holds a plan with `ring` for every size class. Where the job unhooks
for the baseline, such a plan goes straight to the check against plain DDP
(autotune/tuning/plain_check.py): blocks of iterations on DDP's reducer without the hook (plain
DDP) and with it (the plan), rebuilt at each switch. A delay in a forward pre-hook of the test's
makes one of the two slower.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from headlines import assert_never_claims_early
from unhook_jobs import KEEPS_BASELINE, Aside, beside_plain

from autotune.comm.launch import run_local
from autotune.plan import Choice, Entry, Gain, Table
from autotune.storage import Store
from autotune.tuning.blocks import BLOCK_STEPS, BLOCK_WARMUP, BLOCKS, CLEAR_STEPS, blocks
from autotune.tuning.plain_check import PlainCheck

pytestmark = pytest.mark.distributed

#: Synced steps each job trains after the check against plain DDP is over (up to `CAP` steps in
#: all).
AFTER = 10
CAP = 800


#: The stored plan's gain: 0.9x the hooked baseline's step, not clear
#: (`autotune.tuning.blocks.CLEAR_BELOW`).
UNCLEAR = Gain(0.9, 0.85, 0.95, 12)


def stored_ring(tmp_path: Path, variant: str = "base", gain: Gain = UNCLEAR) -> dict[str, object]:
    """A storage whose plan for the job's fingerprint runs `ring` for every class (its classes
    learnt from a first job that keeps the baseline; its gain ``gain``), and the job's
    settings."""
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    first = {**KEEPS_BASELINE, "storage": url}
    run_local(beside_plain, 2, variant, 400, "register", first, None, AFTER, timeout_s=600)
    ((key, kept),) = Store(url).tables().items()
    assert kept.classes and kept.runs_native
    classes = {cls: Entry(Choice("ring"), state="locked") for cls in kept.classes}
    table = Table(classes, 0, kept.fingerprint, gain)
    Store(url, run_id="ring-job").save_table(*key, table)
    return {**first, "algorithms": ("ring",), "max_pairs": 6}


def plain_runs(calls: list[int]) -> list[int]:
    """The lengths of the runs of steps without a hook call: the check's blocks of plain DDP."""
    return [len(list(run)) for c, run in itertools.groupby(calls) if c == 0]


def blocks_of(steps: int, pairs: int) -> list[int]:
    """`plain_runs` of a check in blocks of ``steps`` timed steps decided at ``pairs`` pairs (A B
    B A: a block on a rebuilt reducer first runs `BLOCK_WARMUP` untimed iterations, the second
    A of A A none)."""
    one, two = BLOCK_WARMUP + steps, BLOCK_WARMUP + 2 * steps
    return [one, *([two] * (pairs // 2 - 1)), one]


def catch(settings: dict[str, object], slow: str, variant: str = "base") -> list[Aside]:
    runs: list[Aside] = run_local(
        beside_plain, 2, variant, CAP, "register", settings, None, None, slow, AFTER, timeout_s=600
    )
    return runs


@pytest.mark.parametrize("variant", ["base", "static_graph", "no_sync"])
def test_a_plan_faster_than_plain_ddp_keeps_the_hook_with_the_gain_against_plain_ddp(
    tmp_path: Path, variant: str
) -> None:
    runs = catch(stored_ring(tmp_path, variant), slow="plain", variant=variant)
    for r in runs:
        assert r.catch_kept is True, (r.catch_kept, r.refused, r.verdict)
        assert r.aside_at is None and r.hooks_left == 1 and r.reducer_replaced
        assert r.catch_pairs >= 6
        # Blocks without the hook (no calls), and the hook on every synced step since: the
        # stored plan's gain (0.9x) is not clear, so in blocks of 4 timed steps.
        if variant == "base":
            assert plain_runs(r.calls) == blocks_of(BLOCK_STEPS, r.catch_pairs), r.calls
        assert 0 in r.calls[:-AFTER]
        assert all(c == 1 for c, s in zip(r.calls[-AFTER:], r.synced[-AFTER:], strict=True) if s)
        # Every iteration all-reduced by one reducer or the other: DDP's training.
        assert r.plain_rel < 1e-5, r.plain_rel
    assert len({r.hooked for r in runs}) == 1, "ranks' parameters diverged"
    verdict = runs[0].verdict
    assert f"pairs of {BLOCKS}" in verdict and "plan: " in verdict, verdict
    # The confirmed plan's gain is provisional until the check against plain DDP kept it.
    for r in runs:
        assert_never_claims_early(r.headlines)
        checking = [h for h in r.headlines if "still to run: the check against plain DDP" in h]
        assert checking, r.headlines
        assert r.headlines[-1].endswith("x step time: faster with autotune"), r.headlines[-1]
        assert verdict.split("x step time")[0].endswith(r.headlines[-1].split("x ")[0])
    assert runs[0].stored_plan is not None and set(runs[0].stored_plan.values()) == {"ring"}


def test_a_plan_slower_than_plain_ddp_is_dropped_and_the_job_steps_aside(tmp_path: Path) -> None:
    runs = catch(stored_ring(tmp_path), slow="hook")
    at = {r.aside_at for r in runs}
    assert len(at) == 1 and None not in at, [(r.aside_at, r.catch_kept, r.refused) for r in runs]
    for r in runs:
        assert r.catch_kept is False and r.hooks_left == 0 and r.reducer_replaced
        assert r.catch_pairs >= 1  # a pair 3x slower ends a paired test at once
        assert r.calls[-AFTER:] == [0] * AFTER  # no hook since
        # The plan names what runs since, DDP's own all-reduce (it named the plan that lost).
        assert r.plan and set(r.plan.values()) == {"native"}, r.plan
        assert r.plain_rel < 1e-5, r.plain_rel
    assert len({r.hooked for r in runs}) == 1, "ranks' parameters diverged"
    verdict = runs[0].verdict
    assert "beat it through the hook, but ran" in verdict, verdict
    assert "unhooked after iteration" in verdict, verdict
    # Never "faster": provisional through the check, then final, the same on every rank.
    for r in runs:
        assert_never_claims_early(r.headlines)
        assert any("still to run: the check against plain DDP" in h for h in r.headlines)
        assert r.headlines[-1] == (
            f"no gain: plain DDP kept, autotune unhooked after iteration {r.aside_at}"
        )
    assert "provisional" not in verdict, verdict
    # The next job finds the baseline, with no lead: the plan was a stored one, not searched
    # for, and it lost by far (docs/TUNER.md, "After a lost check").
    assert runs[0].stored_plan is not None and set(runs[0].stored_plan.values()) == {"native"}
    stored = Store(f"sqlite:///{tmp_path / 'tuning.db'}").load_table(
        *next(iter(Store(f"sqlite:///{tmp_path / 'tuning.db'}").tables()))
    )
    assert stored is not None and stored.lead is None


def test_a_plan_whose_gain_is_clear_is_checked_in_blocks_of_1_timed_step(tmp_path: Path) -> None:
    """Stored 0.7x the hooked baseline's step (`autotune.tuning.blocks.CLEAR_BELOW`): the
    check's blocks are 1 timed step, on every rank alike, and the verdict says so."""
    runs = catch(stored_ring(tmp_path, gain=Gain(0.7, 0.6, 0.8, 6)), slow="plain")
    for r in runs:
        assert r.catch_kept is True, (r.catch_kept, r.refused, r.verdict)
        assert plain_runs(r.calls) == blocks_of(CLEAR_STEPS, r.catch_pairs), r.calls
    assert len({r.hooked for r in runs}) == 1, "ranks' parameters diverged"
    assert f"pairs of {blocks(CLEAR_STEPS)}" in runs[0].verdict, runs[0].verdict


@pytest.mark.parametrize(("steps", "signed_rank"), [(1, False), (2, True), (BLOCK_STEPS, True)])
def test_a_check_in_blocks_of_one_step_is_judged_on_the_sign_test(
    steps: int, signed_rank: bool
) -> None:
    """A block of several steps is their median, its tails cut, judged on Wilcoxon's
    signed-rank interval; a block of one is a single step, long-tailed and skewed, judged on the
    sign test as the paired tests of steps are (`autotune.tuning.buckets.bucket_test`)."""
    ddp = SimpleNamespace(_comm_hooks=[(object(), object())], module=torch.nn.Linear(2, 1))
    check = PlainCheck(
        ddp,  # type: ignore[arg-type]
        plan="ring",
        settle=lambda: None,
        rehooked=lambda: None,
        max_pairs=12,
        steps=steps,
    )
    assert check._duel.signed_rank is signed_rank
