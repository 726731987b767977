"""The live tuner on spawned ranks: choices follow measurements, ranks never disagree, plans last.

Algorithms with injected delays (tests/jobs/tuner_jobs.py) make the right answers known in advance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from headlines import assert_never_claims_early
from tuner_jobs import (
    KEEPS_SWITCHING,
    SMALL_BYTES,
    Tuned,
    fixed_from_file,
    model,
    register_injected,
    register_with_plan_file,
    tune,
)

from autotune.cli import main
from autotune.comm.launch import run_local
from autotune.plan import Arm, Buckets, Choice, Entry, Gain, NearMiss, Table, size_class
from autotune.storage import Store
from autotune.tuning.class_search import SEGMENTS_WITHIN

pytestmark = pytest.mark.distributed

QUICK = {"tune_warmup": 1, "tune_samples": 2, "fusion_bytes": 0, "max_pairs": 10}
#: Jobs that only need the tuner to settle train until it has (``until_settled``), up to this
#: cap: the step count tuning takes grows when a loaded machine slows the Optuna worker.
SETTLE_CAP = 600


def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuning.db'}"


def study_trials(url: str) -> dict[str, int]:
    """Per autotune study in the storage, its trials that measured (not those a search asked
    and then told as not measured: `autotune.tuning.search.NOT_MEASURED`)."""
    import optuna

    from autotune.tuning.search import NOT_MEASURED

    storage, out = Store(url).storage, {}
    for name in optuna.study.get_all_study_names(storage=storage):
        study = optuna.load_study(study_name=name, storage=storage)
        out[name] = sum(
            1
            for t in study.get_trials(deepcopy=False)
            if not str(t.user_attrs.get("failure", "")).startswith(NOT_MEASURED)
        )
    return out


def test_with_a_baseline_that_is_always_best_the_tuner_locks_the_baseline(
    tmp_path: Path,
) -> None:
    config = {**QUICK, "algorithms": ("slow_ring",), "storage": storage(tmp_path)}
    result = run_local(tune, 2, SETTLE_CAP, config, False, False, None, True, timeout_s=600)[0]
    assert result.settled, result.progress
    # slow_ring was shortlisted for each class (no other candidate) and lost every paired test:
    # on both classes together first, then on each alone.
    assert result.duels and not any(won for _, _, won in result.duels), result.duels
    assert [kind for kind, _, _ in result.duels] == ["joint", "class", "class"]
    assert result.baseline_kept
    assert result.plan and all(c.algorithm == "native" for c in result.plan.values())
    last = max(i for i, *_ in result.messages)
    assert all(a == "native" for i, _, a, _ in result.messages if i == last)
    # Provisional through screening and the paired tests, then final without a gain (plain
    # DDP kept, or a DDP bucket size of autotune's that won its own paired test).
    headlines = [h for h, _ in result.headlines]
    assert_never_claims_early(headlines)
    phases = {phase for h, phase in result.headlines if h.startswith("provisional: ")}
    assert {"screening", "classes"} <= phases, phases
    final = headlines[-1]
    assert final.startswith("no gain: plain DDP kept, autotune unhooked") or (
        "faster with autotune (DDP's own all-reduce in autotune's bucket size" in final
    ), final


def test_a_plan_whose_messages_look_fast_but_whose_step_is_slower_is_not_locked(
    tmp_path: Path,
) -> None:
    # gil_hog's messages take a ring's time; after each it holds the GIL from training.
    config = {**QUICK, "algorithms": ("gil_hog",), "storage": storage(tmp_path)}
    result = run_local(tune, 2, SETTLE_CAP, config, False, False, None, True, timeout_s=600)[0]
    assert result.settled, result.progress
    nominated = [(kind, arm) for kind, arm, _ in result.duels if "gil_hog" in arm]
    assert nominated, result.duels  # screening put it forward on its latency
    assert not any(won for _, _, won in result.duels), result.duels
    assert result.baseline_kept
    assert all(c.algorithm == "native" for c in result.plan.values())


def test_the_best_algorithm_differs_between_size_classes(tmp_path: Path) -> None:
    # Against a baseline slowed down per message, each class's fast choice wins its paired test.
    config = {**QUICK, "algorithms": ("fast_small", "fast_large"), "storage": storage(tmp_path)}
    result = run_local(tune, 2, SETTLE_CAP, config, False, True, None, True, timeout_s=600)[0]
    assert result.settled, (result.progress, result.duels)
    sizes: dict[int, set[int]] = {}
    for _, nbytes, _, _ in result.messages:
        sizes.setdefault(size_class(nbytes), set()).add(nbytes)
    expected = {
        cls: "fast_small" if max(sizes[cls]) <= SMALL_BYTES else "fast_large" for cls in result.plan
    }
    assert {cls: c.algorithm for cls, c in result.plan.items()} == expected
    assert set(expected.values()) == {"fast_small", "fast_large"}  # both kinds of class occur
    # "faster" only once the plan is locked: provisional through every phase before it.
    headlines = [h for h, _ in result.headlines]
    assert_never_claims_early(headlines)
    provisional = {phase for h, phase in result.headlines if h.startswith("provisional: ")}
    assert {"screening", "classes"} <= provisional, provisional
    assert all(phase == "locked" for h, phase in result.headlines if "faster" in h)
    assert headlines[-1].endswith("x step time: faster with autotune"), headlines[-1]
    assert float(headlines[-1].split("x ")[0]) < 1
    assert not result.baseline_kept
    # The table says what the status says: it read final while the job still tuned.
    assert all(status == table for status, table in result.finals), result.finals
    assert result.finals[0] == (False, False) and result.finals[-1] == (True, True)


def test_a_locked_plan_that_loses_its_advantage_falls_back_to_the_baseline(
    tmp_path: Path,
) -> None:
    # native is slow and quick_ring wins; at step 120 native turns fast and quick_ring slow.
    config = {
        **QUICK,
        "algorithms": ("quick_ring",),
        "recheck_every": 30,
        "storage": storage(tmp_path),
    }
    # One step more once settled: the last runs the plan it settled on.
    args = (120 + SETTLE_CAP, config, False, True, 120, True, 1024, False, 1)
    result = run_local(tune, 2, *args, timeout_s=600)[0]
    assert {"class", "joint"} & {kind for kind, _, won in result.duels if won}, result.duels
    rechecks = [won for kind, _, won in result.duels if kind == "recheck"]
    assert False in rechecks, result.duels  # the re-check after the flip found the gain gone
    assert result.settled and result.baseline_kept, (result.progress, result.duels)
    # `locked` (what the example and step_gain report): a re-check leaves the plan locked while
    # it runs (not settled then), the lost one unlocks it, and it ends locked on the baseline.
    locked = [lock for lock, _ in result.states]
    assert any(lock and not settled for lock, settled in result.states), result.states
    first = locked.index(True)
    assert False in locked[first:] and locked[-1], locked
    last = max(i for i, *_ in result.messages)
    assert all(a == "native" for i, _, a, _ in result.messages if i == last)
    # The search started over: the classes were screened again, in the next round's studies.
    import optuna

    names = optuna.study.get_all_study_names(storage=Store(storage(tmp_path)).storage)
    assert any(n.endswith("/r1") and "/class=" in n for n in names), names


def test_ranks_switch_together_for_hundreds_of_steps(tmp_path: Path) -> None:
    config = {**KEEPS_SWITCHING, "storage": storage(tmp_path)}
    runs = run_local(tune, 3, 300, config, True, timeout_s=900)
    sequences = [r.messages for r in runs]
    assert all(s == sequences[0] for s in sequences), "ranks ran different algorithms"
    switches = sum(
        1 for a, b in zip(sequences[0], sequences[0][1:], strict=False) if a[1:] != b[1:]
    )
    assert switches > 30, f"the tuner barely switched ({switches} times)"
    assert len({r.hooked for r in runs}) == 1, "ranks' parameters diverged"
    # Every switch changes only the order of additions: DDP's training to 1e-5.
    assert runs[0].plain_rel < 1e-5, runs[0].plain_rel


def test_a_restarted_job_confirms_the_stored_plan_without_exploring(tmp_path: Path) -> None:
    url = storage(tmp_path)
    config = {"tune_warmup": 0, "tune_samples": 2, "max_pairs": 6, "algorithms": ("tree",)}
    config["storage"] = url
    # fusion_bytes is left to the tuner too; the baseline is slowed so that tree wins.
    first = run_local(tune, 2, SETTLE_CAP, config, False, True, None, True, timeout_s=600)[0]
    assert first.settled, (first.progress, first.duels)
    assert not first.baseline_kept
    trials = Store(url).trial_count()
    assert trials > 0
    # Stored with the model in words, for `autotune show` (the job registered the model).
    ((_, stored),) = Store(url).tables().items()
    params = sum(p.numel() for p in model().parameters())
    assert stored.model == f"Sequential, {params:,} parameters" and stored.final
    second = run_local(tune, 2, SETTLE_CAP, config, False, True, None, True, timeout_s=600)[0]
    assert Store(url).trial_count() == trials  # nothing screened again
    assert [(kind, won) for kind, _, won in second.duels] == [("confirm", True)]
    assert second.settled
    assert second.fusion_bytes == first.fusion_bytes
    assert {cls: second.plan[cls] for cls in first.plan if cls in second.plan} == {
        cls: c for cls, c in first.plan.items() if cls in second.plan
    }


def test_a_job_that_ends_undecided_stores_its_winner_so_far_and_the_next_resumes_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A 300-step job ended "not decided yet" and stored nothing a user could see: the next
    # job started over. Now the first stops as soon as a plan has beaten the baseline.
    url = storage(tmp_path)
    config = {"tune_warmup": 0, "tune_samples": 2, "max_pairs": 6, "algorithms": ("tree",)}
    # unhook: a plan that won through the hook meets plain DDP before it is final.
    config.update(storage=url, fusion_bytes=0, unhook=True)
    args = (False, True, None, False, 1024, True)  # the baseline slowed: tree wins; until_won
    first = run_local(tune, 2, SETTLE_CAP, config, *args, timeout_s=600)[0]
    # Won (the classes' tree together, most often: class tests may be left, or the check).
    assert first.duels and first.duels[-1][2], first.duels
    ((_, stored),) = Store(url).tables().items()
    assert not stored.final, (first.duels, first.steps_run, first.progress)
    assert {e.choice.algorithm for e in stored.classes.values()} & {"tree"}
    assert main(["show", "--storage", url]) == 0
    assert "provisional: the next job resumes from it" in capsys.readouterr().out
    # The next job resumes from that winner: it screens nothing again, runs the class tests the
    # first had left against it, if any (the winner's own classes are locked), then the check
    # against plain DDP, and stores its decision as final.
    won = first.duels[-1][1]
    trials = study_trials(url)
    second = run_local(tune, 2, SETTLE_CAP, config, False, True, None, True, timeout_s=600)[0]
    assert second.settled and second.duels[-1][0] == "catch", second.duels
    assert all(kind == "class" and won in plan for kind, plan, _ in second.duels[:-1])
    assert won not in {plan for kind, plan, _ in second.duels[:-1]}, second.duels
    # No class is screened again (a search that finds its study done may ask a trial, and
    # tells it at once as not measured).
    assert study_trials(url) == trials
    ((_, decided),) = Store(url).tables().items()
    assert decided.final


def test_two_models_alternating_on_one_storage_each_start_from_their_own_plan(
    tmp_path: Path,
) -> None:
    # Two models of the same fingerprint whose buckets fall in the same size classes: the first
    # can only pick tree, the second ring (the baseline slowed, so each wins). Run again, each
    # confirms its own plan, and neither undoes the other's.
    url = storage(tmp_path)
    config: dict[str, Any] = {"tune_warmup": 0, "tune_samples": 2, "max_pairs": 6}
    config.update(fusion_bytes=0, storage=url)

    def job(width: int, algorithms: tuple[str, ...]) -> Tuned:
        runs: list[Tuned] = run_local(
            tune,
            2,
            SETTLE_CAP,
            {**config, "algorithms": algorithms},
            False,
            True,
            None,
            True,
            width,
            timeout_s=600,
        )
        assert runs[0].settled, (runs[0].progress, runs[0].duels)
        return runs[0]

    def algorithms(run: Tuned) -> set[str]:
        return {c.algorithm for c in run.plan.values()}

    a = job(1024, ("tree",))
    b = job(1023, ("ring",))
    assert a.workload != b.workload and {a.workload[:7], b.workload[:7]} == {"layout-"}
    classes = {size_class(n) for i, n, *_ in a.messages if i > 0}
    assert classes == {size_class(n) for i, n, *_ in b.messages if i > 0}  # the same classes
    assert algorithms(a) == {"tree"} and algorithms(b) == {"ring"}
    trials = Store(url).trial_count()
    for width, first in ((1024, a), (1023, b), (1024, a)):
        again = job(width, ("tree", "ring"))
        assert again.workload == first.workload
        assert [(kind, won) for kind, _, won in again.duels] == [("confirm", True)], again.duels
        assert again.plan == first.plan
    assert Store(url).trial_count() == trials  # nothing screened again
    stored = Store(url).tables()
    assert sorted(w for _, w in stored) == sorted([a.workload, b.workload])
    for run in (a, b):
        (table,) = [t for (_, w), t in stored.items() if w == run.workload]
        assert {e.choice.algorithm for e in table.classes.values()} == algorithms(run)


@pytest.mark.usefixtures("clean_registry")
def test_a_stored_baseline_gives_the_plan_that_came_close_one_more_duel(tmp_path: Path) -> None:
    url = storage(tmp_path)
    config = {**QUICK, "algorithms": ("slow_ring",), "storage": url}
    first = run_local(tune, 2, SETTLE_CAP, config, False, False, None, True, timeout_s=600)[0]
    assert first.settled and first.baseline_kept, (first.progress, first.duels)
    (key, kept), *others = Store(url).tables().items()
    assert not others and kept.lead is None  # slow_ring lost by far: nothing came close
    trials = Store(url).trial_count()

    def job_with_lead(
        algorithm: str,
        slow_native: bool,
        run_id: str,
        buckets: Buckets | None = None,
        kind: str = "near",
    ) -> Tuned:
        """A job from the stored baseline with a lead of ``kind`` on ``algorithm`` for every
        class (and the bucket size that the job that stored it unhooked into)."""
        arm = Arm.of({cls: Choice(algorithm) for cls in kept.classes}, 0)
        lead = NearMiss(arm, Gain(0.96, 0.9, 1.02, 10), kind)
        table = Table(kept.classes, 0, kept.fingerprint, None, lead, buckets)
        Store(url, run_id=run_id).save_table(*key, table)
        job = {**config, "algorithms": (algorithm,)}
        runs: list[Tuned] = run_local(
            tune, 2, SETTLE_CAP, job, False, slow_native, None, True, timeout_s=600
        )
        return runs[0]

    register_injected()  # to read back tables that name them

    # A lead that loses its second paired test: the baseline, and the lead is forgotten.
    lost = job_with_lead("slow_ring", False, "seed-1")
    assert [(kind, won) for kind, _, won in lost.duels] == [("retry", False)], lost.duels
    assert lost.settled and lost.baseline_kept
    assert all(c.algorithm == "native" for c in lost.plan.values())
    stored = Store(url).load_table(*key)
    assert stored is not None and stored.lead is None
    # A lead that wins it (the baseline slowed): locked, without screening anything again.
    # The stored bucket size goes with the baseline it was kept beside: the table the job
    # stores keeps the hook's plan and no bucket size (both would not load). A lead stored
    # after a lost check against plain DDP (the plan the checked one beat) is retried alike.
    bucket_size = Buckets(4 << 20, Gain(0.9, 0.85, 0.95, 12))
    won = job_with_lead("quick_ring", True, "seed-2", bucket_size, "beaten")
    assert [(kind, won) for kind, _, won in won.duels] == [("retry", True)], won.duels
    assert won.settled and not won.baseline_kept
    assert {cls: c.algorithm for cls, c in won.plan.items() if cls in kept.classes} == {
        cls: "quick_ring" for cls in kept.classes
    }
    assert Store(url).trial_count() == trials
    stored = Store(url, run_id="seed-2").load_table(*key)
    assert stored is not None and stored.buckets is None
    assert {c.choice.algorithm for c in stored.classes.values()} == {"quick_ring"}


def test_a_json_table_runs_as_a_fixed_plan(tmp_path: Path) -> None:
    table = Table(
        {128 << 10: Entry(Choice("two_tree")), 2 << 20: Entry(Choice("ring", 256 << 10))},
        fusion_bytes=0,
    )
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(table.to_json()))
    for no_tuner, used, plan in run_local(fixed_from_file, 2, str(path)):
        assert no_tuner
        assert used == {"two_tree", "ring"}
        assert plan[2 << 20] == Choice("ring", 256 << 10)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        # Once accepted: no message was all-reduced and the ranks trained apart, exit code 0.
        ('{"classes": {}, "fusion_bytes": -64}', "fusion_bytes: must be 0"),
        ('{"classes": {"1024": {"algorithm": "ring", "segment_bytes": -1}}}', "segment_bytes"),
        ('{"classes": {"1024": {"algorithm": "fastest"}}}', "unknown algorithm 'fastest'"),
        # One element per round: the first step of a small model did not end in 45 s.
        ('{"classes": {"1024": {"algorithm": "ring", "segment_bytes": 3}}}', "at least 4096"),
        ("{oops", "is not JSON"),
        # Once a bare UnicodeDecodeError, without the file's name.
        (b"\x80\x81\xfe binary", "is not JSON: not UTF-8 text"),
        (None, "cannot read plan file"),
    ],
)
def test_a_bad_plan_file_fails_at_register_naming_the_file(
    tmp_path: Path, content: str | bytes | None, words: str
) -> None:
    path = tmp_path / "plan.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    for message in run_local(register_with_plan_file, 2, str(path)):
        assert f"plan file {str(path)!r}" in message and words in message, message


@pytest.mark.parametrize(
    ("alpha_s", "beta_s_per_byte", "worst_error", "prunes"),
    [
        # Every round 10 ms, bytes free, 5% worst error: a choice with more rounds than the
        # fewest (a segmented one, in the classes large enough to have segments) is left out.
        (0.01, 0.0, 0.05, True),
        # Bytes dear, rounds cheap, a fit too rough to bound anything: nothing is left out, but
        # the order differs by algorithm (the ring unsegmented first, the tree segmented first),
        # which the study's parameters must still accept.
        (1e-4, 1e-8, 1.5, False),
    ],
)
def test_a_stored_prior_orders_screening_and_leaves_out_what_cannot_win(
    tmp_path: Path, alpha_s: float, beta_s_per_byte: float, worst_error: float, prunes: bool
) -> None:
    import optuna

    from autotune.algorithms import BUILTINS
    from autotune.config import Config
    from autotune.model import Link, Params, Prior
    from autotune.storage import device_model, fingerprint, fingerprint_key
    from autotune.tuning.space import search_space

    url = storage(tmp_path)
    fp = fingerprint(
        backend="gloo", world_size=2, nodes=1, device=device_model("cpu"), dtype="float32"
    )
    key = fingerprint_key(fp)
    link = Link(alpha_s, beta_s_per_byte)
    prior = Prior(Params(link, link), worst_error=worst_error)
    Store(url).save_prior(key, prior.to_json())
    config = {**QUICK, "storage": url}  # the built-in candidates: the prior may leave some out
    result = run_local(tune, 2, SETTLE_CAP, config, False, False, None, True, timeout_s=600)[0]
    assert result.settled, result.progress
    # The built-ins; NCCL's own combinations (autotune-nccl) are not offered on gloo.
    assert result.candidates == Config().candidates[: len(BUILTINS)]
    left_out: set[Choice] = set()
    reordered = False
    classes = 0
    for name in optuna.study.get_all_study_names(storage=url):
        if not name.startswith(f"autotune/{key}/class="):
            continue
        classes += 1
        cls = int(name.split("class=")[1].split("/")[0])
        study = optuna.load_study(study_name=name, storage=url)
        values = {
            Choice(t.params["algorithm"], t.params.get("segment_bytes") or None): t.value
            for t in study.trials
        }
        tried = set(values)
        space = search_space(cls, result.candidates)
        kept = prior.order(cls, 2, space, keep=Choice("native"))
        # Each algorithm kept is measured, at its first in the prior's order; none left out is.
        assert tried <= set(kept), (cls, tried, kept)
        leads = {c.algorithm: c for c in reversed(kept)}
        assert set(leads.values()) <= tried, (cls, tried, kept)
        # Another segment size kept is measured unless its algorithm screened out of the race.
        best = min(v for v in values.values() if v is not None)
        for c in set(kept) - tried:
            mine = [v for o, v in values.items() if o.algorithm == c.algorithm and v is not None]
            assert not mine or min(mine) > SEGMENTS_WITHIN * best, (cls, c, values)
        left_out |= set(space) - set(kept)
        firsts = {c.algorithm: c.segment_bytes for c in reversed(kept)}  # each one's first
        reordered |= firsts.get("ring", 0) != firsts.get("tree", 0)
    assert classes >= 2
    if prunes:
        assert left_out and all(c.segment_bytes is not None for c in left_out), left_out
    else:
        assert not left_out and reordered
