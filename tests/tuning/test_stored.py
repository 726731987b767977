"""What a job takes from a stored plan (`autotune.tuning.stored`): the part it can run, confirmed
before it is locked, or nothing where the stored plan is the measured baseline."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from autotune import Config
from autotune.plan import Arm, Choice, Entry, Gain, NearMiss, Table
from autotune.storage import SWEEP, Store
from autotune.tuning.decider import Decider
from autotune.tuning.stored import Stored, provisional, read_stored, seeded, stored_arm

RING, TREE, NATIVE = Choice("ring", 1 << 20), Choice("tree"), Choice("native")
FUSIONS = (0, 1 << 20, 4 << 20, 16 << 20)
GAIN = Gain(0.9, 0.85, 0.95, 24)


def test_only_locked_classes_this_job_can_run_are_taken() -> None:
    table = Table(
        {
            1 << 20: Entry(RING, 1e-3, 5, "locked"),
            2 << 20: Entry(TREE, 2e-3, 5, "exploring"),  # not locked: screened again
            4 << 20: Entry(Choice("shm"), 3e-3, 5, "locked"),  # not in this job's space
        },
        4 << 20,
        gain=GAIN,
    )
    arm = stored_arm(table, Arm(), lambda cls, c: c != Choice("shm"), FUSIONS)
    assert arm == Arm.of({1 << 20: RING}, 4 << 20)
    # A job that does not tune the fusion size keeps the baseline's.
    assert stored_arm(table, Arm(), lambda cls, c: True, None) == Arm.of(
        {1 << 20: RING, 4 << 20: Choice("shm")}, 0
    )
    # A stored fusion size this job may not tune to is not taken either.
    odd = Table({1 << 20: Entry(RING, state="locked")}, 3 << 20, gain=GAIN)
    assert stored_arm(odd, Arm(), lambda cls, c: True, FUSIONS) == Arm.of({1 << 20: RING}, 0)


def test_a_measured_baseline_has_nothing_to_confirm_an_unmeasured_one_has() -> None:
    baseline = Table({1 << 20: Entry(NATIVE, state="locked")}, 0, gain=GAIN)
    assert stored_arm(baseline, Arm(), lambda cls, c: c != NATIVE, FUSIONS) is None
    unmeasured = Table({1 << 20: Entry(NATIVE, state="locked")}, 0)
    assert stored_arm(unmeasured, Arm(), lambda cls, c: c != NATIVE, FUSIONS) == Arm()


def test_read_stored_reads_the_plan_and_ignores_an_unreadable_prior(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'tuning.db'}")
    assert read_stored(store, "k", "cnn") == Stored(None, None, None)
    table = Table({1 << 20: Entry(RING, 1e-3, 5, "locked")}, 0, gain=GAIN)
    store.save_table("k", "cnn", table)
    store.save_prior("k", {"not": "a prior"})
    got = read_stored(store, "k", "cnn")
    assert got.table is not None and got.table.classes == table.classes
    assert got.prior is None and got.seed is None


def test_a_workload_without_a_plan_reads_the_sweeps_classes_as_its_seed(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'tuning.db'}")
    sweep = Table({1 << 20: Entry(TREE, 1e-3, 5, "locked")})
    store.save_table("k", SWEEP, sweep)
    assert read_stored(store, "k", "cnn") == Stored(None, sweep, None)
    # A workload with a plan of its own runs that: the seed is not read.
    mine = Table({1 << 20: Entry(RING, 1e-3, 5, "locked")}, 0, gain=GAIN)
    store.save_table("k", "cnn", mine)
    got = read_stored(store, "k", "cnn")
    assert got.table is not None and got.table.classes == mine.classes and got.seed is None


def test_a_sweeps_screening_seeds_only_a_locked_class_this_job_can_run() -> None:
    seed = Table(
        {
            1 << 20: Entry(RING, 1e-3, 5, "locked"),
            2 << 20: Entry(TREE, 2e-3, 5, "exploring"),  # screened, not locked
            4 << 20: Entry(TREE, None, 5, "locked"),  # locked without a latency
            8 << 20: Entry(Choice("shm"), 3e-3, 5, "locked"),  # not in this job's space
        },
        None,
    )
    space = [NATIVE, RING, TREE]
    assert seeded(seed, 1 << 20, space) == (RING, 1e-3)
    assert [seeded(seed, cls, space) for cls in (2 << 20, 4 << 20, 8 << 20, 16 << 20)] == [None] * 4


def test_an_undecided_job_stores_its_winner_so_far_as_a_provisional_table() -> None:
    table = Table(
        {1 << 20: Entry(RING, 1e-3, 5, "exploring"), 2 << 20: Entry(TREE, 2e-3, 4, "exploring")},
        None,
        gain=GAIN,
    )
    stored = provisional(table, Arm.of({1 << 20: RING}, 4 << 20))
    assert not stored.final and stored.fusion_bytes == 4 << 20 and stored.gain == GAIN
    assert stored.classes == {
        1 << 20: Entry(RING, 1e-3, 5, "locked"),  # the winner so far
        2 << 20: Entry(TREE, 2e-3, 4, "exploring"),
    }
    assert stored.lead is None and stored.estimate is None
    # The plan's estimate, for the next job's check (`autotune.tuning.blocks.check_steps_for`).
    assert provisional(table, Arm.of({1 << 20: RING}, 4 << 20), estimate=0.66).estimate == 0.66
    # The fusion size that came close and has yet to meet the plan again is its lead.
    near = NearMiss(Arm((), 16 << 20), Gain(0.96, 0.9, 1.02, 16))
    assert provisional(table, Arm.of({1 << 20: RING}, 0), near).lead == near
    # Once the class tests are over, every class is decided, the baseline's where none won:
    # the next job tests none again.
    ran = Table(
        {1 << 20: Entry(RING, 1e-3, 5, "exploring"), 2 << 20: Entry(NATIVE, 3e-3, 4, "exploring")}
    )
    tested = provisional(ran, Arm.of({1 << 20: RING}, 0), None, tested=True)
    assert {cls: e.state for cls, e in tested.classes.items()} == {
        1 << 20: "locked",
        2 << 20: "locked",
    }
    assert stored_arm(tested, Arm(), lambda cls, c: True, FUSIONS) == Arm.of({1 << 20: RING}, 0)


def rank0_decider(tmp_path: Path, buckets: list[tuple[int, str]]) -> Decider:
    """Rank 0's decider for a stand-in tuner (`autotune.tuning.decider.Tuned`): DDP's
    ``buckets``, fusion tuned, native and tree to choose from, its storage under ``tmp_path``.
    Close it."""
    tuner = SimpleNamespace(
        config=Config(storage=f"sqlite:///{tmp_path / 'plans.db'}"),
        engine=SimpleNamespace(buckets=buckets),
        baseline=Arm(),
        tune_fusion=True,
        unhooks=True,
        frozen=False,
        described="a model",
        buckets=None,
        space=lambda cls: [NATIVE, TREE],
        needs_hook=lambda arm: bool(arm.choices),
    )
    return Decider(tuner)


def test_a_resumed_job_meets_the_fusion_size_its_provisional_table_holds_again(
    tmp_path: Path,
) -> None:
    """The first job ended with a plan won on DDP's buckets and a fusion size that came close
    still to meet it (`provisional`'s lead): the job that loads that table, through the storage,
    resumes from screening with that plan and, its class locked, tests that fusion size with the
    plan's choice carried before the check against plain DDP."""
    mib = 1 << 20
    won = Arm.of({mib: TREE}, 0)
    near = NearMiss(Arm((), 4 * mib), Gain(0.96, 0.9, 1.02, 16))
    screened = Table({mib: Entry(TREE, 1e-3, 5, "exploring")}, None, gain=GAIN)
    decider = rank0_decider(tmp_path, [(mib, "float32")] * 3)
    try:
        store = decider.store()
        store.save_table("key", "model", provisional(screened, won, near))
        decider._loaded(read_stored(store, "key", "model"))
        search = decider.plan_search
        assert search.phase == "screening" and search.incumbent == won
        assert decider.classes[mib].state == "locked" and decider.classes[mib].desired == TREE
        search.screened([])  # the won class is locked: nothing shortlisted
        assert search.match is not None and search.match.kind == "fusion"
        assert search.match.challenger == Arm.of({mib: TREE, 4 * mib: TREE}, 4 * mib)
        # Until that test ends, a provisional table stores the near miss again.
        assert provisional(decider.table(), search.incumbent, search.fusion_near).lead == near
    finally:
        decider.close(10)


def test_a_class_the_plan_carried_a_choice_to_without_screening_is_stored_with_it(
    tmp_path: Path,
) -> None:
    """A fusion size met again with algorithms (`PlanSearch._refuse`) makes classes nobody
    screened: the table rank 0 stores holds their choices all the same, or the next job would
    run them on the baseline."""
    decider = rank0_decider(tmp_path, [])
    try:
        decider.plan_search.incumbent = Arm.of({4 << 20: Choice("shm")}, 4 << 20)
        decider.plan_search.phase = "locked"
        table = decider.table()
    finally:
        decider.close(10)
    assert table.classes == {4 << 20: Entry(Choice("shm"), None, 0, "locked")}
    assert stored_arm(table, Arm(), lambda cls, c: True, FUSIONS) == Arm.of(
        {4 << 20: Choice("shm")}, 4 << 20
    )
