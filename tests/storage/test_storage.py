"""Shared tuning storage: several jobs at once on one SQLite file or one PostgreSQL database.

The races here were seen before they were fixed, with the same real concurrent processes: two
processes opening a new SQLite file at once failed in 3 of 10 tries (``UNIQUE constraint failed:
alembic_version.version_num``, ``table ... already exists``), and two 2-rank jobs tuning one
fingerprint at once failed or left trials running (docs/FAULTS.md has the counts).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_jobs import gloo_cpu_key
from postgres_server import Postgres
from tuner_jobs import tune

from autotune.comm.launch import launch, run_local
from autotune.plan import Arm, Buckets, Choice, Entry, Gain, NearMiss, Table
from autotune.storage import EARLIER, SWEEP, Store, merge_tables, workload_name


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    try:
        yield server
    finally:
        server.close()


def _open(urls: list[str], barrier: Any, results: Any) -> None:
    for k, url in enumerate(urls):
        barrier.wait()  # all at the same moment, each round
        try:
            Store(url)
            results.put((k, "ok"))
        except Exception as exc:
            results.put((k, repr(exc)))


def open_at_once(urls: list[str], processes: int) -> list[list[str]]:
    """``processes`` processes open each of ``urls`` in turn, all at the same moment; what each
    got, per URL. The processes start once (importing torch and optuna takes seconds), then race
    on every URL."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(urls, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    got: list[list[str]] = [[] for _ in urls]
    for _ in range(processes * len(urls)):
        k, outcome = results.get(timeout=120)
        got[k].append(outcome)
    for p in procs:
        p.join(60)
    return got


@pytest.mark.distributed
def test_jobs_opening_a_new_sqlite_file_at_once(tmp_path: Path) -> None:
    urls = [f"sqlite:///{tmp_path / f'tuning{attempt}.db'}" for attempt in range(8)]
    assert open_at_once(urls, 3) == [["ok"] * 3] * 8


@pytest.mark.distributed
@pytest.mark.needs_server
def test_jobs_opening_a_new_postgresql_database_at_once(postgres: Postgres) -> None:
    urls = [postgres.database() for _ in range(4)]
    assert open_at_once(urls, 3) == [["ok"] * 3] * 4


def tune_two_jobs_at_once(url: str, max_steps: int = 1000) -> list[Any]:
    """Each job trains until its plan is locked (a loaded machine slows the Optuna answers that
    tuning waits for, so a fixed step count locked in one CI run out of many and not in another)."""
    config = {"tune_warmup": 0, "tune_samples": 2, "max_pairs": 6, "storage": url}
    out: list[Any] = [None, None]

    def job(i: int) -> None:
        out[i] = launch(tune, 2, max_steps, config, False, False, None, True, timeout_s=400)

    threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for results in out for r in results]


def check_shared(url: str, results: list[Any]) -> None:
    import optuna
    from optuna.trial import TrialState

    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    assert all(r.value.settled for r in results), [r.value.steps_run for r in results]
    store = Store(url)
    running = []
    for name in optuna.study.get_all_study_names(storage=store.storage):
        study = optuna.load_study(study_name=name, storage=store.storage)
        running += [(name, t.number) for t in study.get_trials(states=(TrialState.RUNNING,))]
    assert running == [], "trials left running by jobs that ended"
    # Each job stored the plan it locked under its own key, both under the one workload their
    # one model names; the plan read back merges them.
    ((key, workload),) = store.tables()
    assert workload.startswith("layout-")
    plan_study = optuna.load_study(study_name=f"autotune/{key}/plan", storage=store.storage)
    assert len([k for k in plan_study.user_attrs if k.startswith(f"table/{workload}/")]) == 2
    table = store.load_table(key, workload)
    assert table is not None and table.fusion_bytes is not None
    locked = {cls for cls, e in table.classes.items() if e.state == "locked"}
    shared = []
    for r in results:
        if r.rank == 0:
            progress = r.value.progress
            assert progress["fusion"].state == "locked", progress
            mine = {k for k, p in progress.items() if p.state == "locked" and k != "fusion"}
            assert mine <= locked, (mine, table)
            shared.append(any(p.trials_total < p.trials for p in progress.values()))
    # A job ran only part of the trials its studies hold: it took the other's. (Both, most
    # often; where one job starts screening well ahead it may run every trial itself, and the
    # later one takes them: a loaded CI machine did that once.)
    assert any(shared), [r.value.progress for r in results if r.rank == 0]


@pytest.mark.distributed
@pytest.mark.parametrize("attempt", [1, 2])
def test_two_jobs_tune_one_fingerprint_at_once_on_sqlite(tmp_path: Path, attempt: int) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    check_shared(url, tune_two_jobs_at_once(url))


@pytest.mark.distributed
@pytest.mark.needs_server
def test_two_jobs_tune_one_fingerprint_at_once_on_postgresql(postgres: Postgres) -> None:
    url = postgres.database()
    check_shared(url, tune_two_jobs_at_once(url))


def test_only_a_dead_jobs_trials_are_failed(tmp_path: Path, stale_after_s: float) -> None:
    import optuna
    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    alive, dead, other = Store(url), Store(url), Store(url)
    study = alive.study("key", "class=1024")
    live_trial, dead_trial = study.ask(), study.ask()
    alive.started(live_trial)
    dead.started(dead_trial)  # then its job stops beating: it crashed
    deadline = time.monotonic() + stale_after_s
    while time.monotonic() < deadline:  # the dead job's trial goes stale; the live one beats
        time.sleep(0.5)
        alive.beat()
    other.fail_stale_trials(optuna.load_study(study_name=study.study_name, storage=other.storage))
    states = {t.number: t.state for t in study.get_trials()}
    assert states == {live_trial.number: TrialState.RUNNING, dead_trial.number: TrialState.FAIL}


def entry(algorithm: str, best_s: float | None, state: str = "locked") -> Entry:
    return Entry(Choice(algorithm), best_s, 3, state)


def test_the_stored_plan_of_several_jobs_follows_one_rule() -> None:
    older = Table({1024: entry("ring", 2e-3), 4096: entry("tree", None)}, fusion_bytes=0)
    newer = Table(
        {1024: entry("tree", 3e-3), 4096: entry("ring", None), 8192: entry("native", 1e-3)},
        fusion_bytes=1 << 20,
    )
    exploring = Table({1024: entry("two_tree", 1e-4, state="exploring")})
    saved = [(1.0, older), (2.0, newer), (3.0, exploring)]
    merged = merge_tables(saved)
    assert merged.classes[1024].choice == Choice("tree")  # the newest locked, latency aside
    assert merged.classes[4096].choice == Choice("ring")
    assert merged.classes[8192].choice == Choice("native")
    assert merged.fusion_bytes == 1 << 20  # the newest locked fusion size
    assert merged.lead is None  # the newest table has none
    # Whatever order the jobs wrote in, the same plan.
    assert merge_tables(list(reversed(saved))) == merged


def test_a_plan_a_later_job_dropped_does_not_come_back() -> None:
    # Job 1 locked tree for 1 KiB (its screening: 1 ms); job 2 confirmed it on the step, lost,
    # and stored the baseline (native's screening: 2 ms). The next job starts from the baseline.
    kept = Table({1024: entry("tree", 1e-3), 2048: entry("native", 1e-3)}, fusion_bytes=0)
    dropped = Table({1024: entry("native", 2e-3), 2048: entry("native", 1e-3)}, fusion_bytes=0)
    merged = merge_tables([(1.0, kept), (2.0, dropped)])
    assert {cls: e.choice for cls, e in merged.classes.items()} == {
        1024: Choice("native"),
        2048: Choice("native"),
    }
    # A class only the older job saw keeps its choice.
    older = Table({1024: entry("tree", 1e-3), 4096: entry("ring", 1e-3)}, fusion_bytes=0)
    merged = merge_tables([(1.0, older), (2.0, dropped)])
    assert merged.classes[4096].choice == Choice("ring")


def test_the_bucket_size_is_the_newest_tables() -> None:
    unhooking = Table({1024: entry("native", 1e-3)}, 0, buckets=Buckets(4 << 20, None))
    later = Table({1024: entry("native", 1e-3)}, 0, buckets=Buckets(16 << 20, None))
    assert merge_tables([(1.0, unhooking), (2.0, later)]).buckets == Buckets(16 << 20, None)
    assert merge_tables([(2.0, unhooking), (1.0, later)]).buckets == Buckets(4 << 20, None)


def test_a_bucket_size_is_not_merged_beside_a_python_driven_class() -> None:
    # An older job kept shm for a class the newest job, which unhooked with 4 MiB buckets,
    # never saw: the merged plan runs shm there, through the hook, so no bucket size applies
    # (a table with both does not load: `Table.from_json`).
    older = Table({4096: entry("shm", 1e-3)}, 0)
    unhooking = Table({1024: entry("native", 1e-3)}, 0, buckets=Buckets(4 << 20, None))
    merged = merge_tables([(1.0, older), (2.0, unhooking)])
    assert merged.classes[4096].choice == Choice("shm") and merged.buckets is None
    assert Table.from_json(merged.to_json()) == merged
    assert merge_tables([(1.0, unhooking)]).buckets == Buckets(4 << 20, None)


def test_the_lead_is_the_newest_tables_settled_or_not() -> None:
    lead = NearMiss(Arm((), 4 << 20), Gain(0.95, 0.9, 1.02, 24))
    kept = Table({1024: entry("native", 1e-3)}, fusion_bytes=0, lead=lead)
    settled = Table({1024: entry("native", 1e-3)}, fusion_bytes=0)  # the next job: lead lost
    assert merge_tables([(1.0, kept)]).lead == lead
    assert merge_tables([(1.0, kept), (2.0, settled)]).lead is None
    assert merge_tables([(2.0, kept), (1.0, settled)]).lead == lead


def test_a_provisional_plan_keeps_the_fusion_sizes_its_job_left_through_the_storage(
    tmp_path: Path,
) -> None:
    # Merging dropped them: a job that resumed one that ended among its fusion sizes met none.
    mib = 1 << 20
    left = Table({1024: entry("shm", 1e-3)}, 0, final=False, fusion_left=(4 * mib, 16 * mib))
    Store(f"sqlite:///{tmp_path / 'tuning.db'}").save_table("key", "cnn", left)
    table = Store(f"sqlite:///{tmp_path / 'tuning.db'}").load_table("key", "cnn")
    assert table is not None and table.fusion_left == (4 * mib, 16 * mib) and not table.final
    # Its plan's estimate too (dropped as well, until a resumed job's check went in blocks of 4
    # where the short job's would have been 2: docs/TUNER.md).
    rated = dataclasses.replace(left, estimate=0.66)
    Store(f"sqlite:///{tmp_path / 'tuning.db'}").save_table("key", "mlp", rated)
    assert Store(f"sqlite:///{tmp_path / 'tuning.db'}").load_table("key", "mlp") == rated
    assert (
        merge_tables([(1.0, left), (2.0, Table({1024: entry("shm", 1e-3)}, 0))]).fusion_left == ()
    )


def test_each_run_stores_its_own_plan_and_reads_its_workloads_merge(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    a, b = Store(url, run_id="a"), Store(url, run_id="b")
    a.save_table("key", "cnn", Table({1024: entry("ring", 1e-3)}, fusion_bytes=0))
    lead = NearMiss(Arm(((8 << 20, Choice("ring", 1 << 20)),), 16 << 20), Gain(0.96, 0.9, 1.01, 30))
    b.save_table(
        "key", "cnn", Table({1024: entry("tree", 2e-3), 2048: entry("tree", 1e-3)}, lead=lead)
    )
    for store in (a, b, Store(url)):
        table = store.load_table("key", "cnn")
        assert table is not None
        assert table.classes[1024].choice == Choice("tree")  # b's, the newer
        assert table.classes[2048].choice == Choice("tree")
        assert table.lead == lead  # b's, the newer


def test_a_workload_is_named_by_its_gradient_layout() -> None:
    cnn = [(2 << 20, "float32"), (512 << 10, "float32")]
    assert workload_name(cnn) == workload_name(list(cnn))  # the same model, the same name
    assert workload_name(cnn).startswith("layout-")
    others = [
        cnn[::-1],  # another order
        [(2 << 20, "float32"), (512 << 10 + 4, "float32")],  # four bytes more
        [(2 << 20, "bfloat16"), (512 << 10, "float32")],  # another dtype
        cnn[:1],
    ]
    assert len({workload_name(cnn), *map(workload_name, others)}) == 1 + len(others)


def test_workloads_keep_their_own_plans_and_a_sweep_only_seeds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    store = Store(url, run_id="r")
    cnn = Table({1024: entry("ring", 1e-3), 8 << 20: entry("native", 4e-3)}, fusion_bytes=0)
    mlp = Table({1024: entry("native", 1e-3)}, fusion_bytes=1 << 20)
    sweep = Table({1024: entry("shm", 5e-4), 4096: entry("shm", 6e-4)})
    store.save_table("key", "cnn", cnn)
    store.save_table("key", "mlp", mlp)  # later: the newer table, but another workload's
    Store(url, run_id="s").save_table("key", SWEEP, sweep)
    assert store.load_table("key", "cnn") == cnn
    assert store.load_table("key", "mlp") == mlp
    assert store.load_table("key", "bert") is None
    assert store.load_table("other", "cnn") is None
    assert store.load_seed("key") == sweep
    assert store.load_seed("other") is None
    assert store.tables() == {("key", "cnn"): cnn, ("key", "mlp"): mlp, ("key", SWEEP): sweep}


def test_plans_stored_before_workloads_seed_searches(tmp_path: Path) -> None:
    # "table" (before plans were kept per run) and "table/<run>" (per run, before workloads):
    # whose model they were tuned for is unknown, so no job takes them for its own plan.
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    store = Store(url)
    plan = store.study("key", "plan")
    oldest = Table({1024: entry("ring", 1e-3), 2048: entry("tree", 1e-3)}, fusion_bytes=0)
    old = Table({1024: entry("shm", 2e-3)}, fusion_bytes=0)
    plan.set_user_attr("table", oldest.to_json())
    record = {"saved_at": 5.0, "job": "0123abcd", "table": old.to_json()}
    plan.set_user_attr("table/0123abcd", record)
    seed = store.load_seed("key")
    assert seed is not None
    assert {cls: e.choice.algorithm for cls, e in seed.classes.items()} == {
        1024: "shm",  # the newer
        2048: "tree",
    }
    assert store.tables().keys() == {("key", EARLIER)}
    assert store.load_table("key", "cnn") is None


def test_a_bad_stored_plan_names_the_storage_and_the_workload(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    store = Store(url, run_id="j1")
    bad = {"saved_at": 1.0, "table": {"classes": {}, "fusion_bytes": -64}}
    store.study("key", "plan").set_user_attr("table/cnn/j1", bad)
    with pytest.raises(
        ValueError, match=r"tuning storage .*plan key/cnn \(table/cnn/j1\): fusion_bytes"
    ):
        store.load_table("key", "cnn")


OWNER = str(Path(__file__).parents[1] / "jobs" / "trial_owner.py")


def _states(url: str, study_name: str) -> dict[int, tuple[str, str | None]]:
    import optuna

    study = optuna.load_study(study_name=study_name, storage=Store(url).storage)
    return {t.number: (t.state.name, t.user_attrs.get("failure")) for t in study.get_trials()}


@pytest.mark.distributed
def test_a_restarted_torchrun_job_fails_its_own_trials_and_no_other_jobs(tmp_path: Path) -> None:
    # Plain `torchrun --master-port` gives every job the run id "none": a restart of one job
    # used to fail every other job's running trials as "an earlier attempt".
    import subprocess
    import sys

    url, study = f"sqlite:///{tmp_path / 'tuning.db'}", "autotune/key/class=1024/min"
    Store(url).study("key", "class=1024/min")
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "none"}
    # Job A: attempt 0 holds a trial, alive. Job B (another torchrun, another agent): attempt
    # 0 runs a trial and dies; attempt 1 sweeps, as its tuner does when it loads the plan.
    job_a = subprocess.Popen(
        [sys.executable, OWNER, url, study, "agent", "hold"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert job_a.stdout is not None
        a_trial = int(job_a.stdout.readline())
        out = subprocess.run(
            [sys.executable, OWNER, url, study, "agent", "crash", "sweep"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        b_trial = int(out.stdout.split()[0])
        states = _states(url, study)
        assert states[a_trial] == ("RUNNING", None), states
        assert states[b_trial] == (
            "FAIL",
            "attempt 0 of this torchrun job ended: its workers restarted",
        ), states
    finally:
        assert job_a.stdin is not None
        job_a.stdin.write("\n")
        job_a.stdin.close()
        job_a.wait(60)


def test_an_earlier_attempt_of_this_torchrun_job_is_dead_even_on_another_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    store = Store(f"sqlite:///{tmp_path / 'tuning.db'}")
    assert store.run is not None and store.run.startswith("none@")
    elsewhere = {"host": "another-host", "pid": 1, "started": 1.0}  # cannot be seen from here
    ours = {"owner": elsewhere, "elastic_run": store.run, "elastic_attempt": 0}
    assert store._dead(ours) == "attempt 0 of this torchrun job ended: its workers restarted"
    # The same run id and attempt from another torchrun (another agent): alive, for all we know.
    theirs = {**ours, "elastic_run": "none@another-host:42:1.000"}
    assert store._dead(theirs) is None
    assert store._dead({**ours, "elastic_attempt": 1}) is None  # this attempt's own


@pytest.mark.distributed
def test_a_killed_jobs_trial_is_failed_by_the_next_job_that_reads_its_fingerprint(
    tmp_path: Path,
) -> None:
    # The next job runs the stored plan: it never opens the class study the dead job tuned in,
    # yet its tuner's load sweeps every study of the fingerprint.
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    key = gloo_cpu_key(2)
    study = f"autotune/{key}/class=1024/min"
    out = subprocess.run(
        [sys.executable, OWNER, url, study, "crash"], capture_output=True, text=True, timeout=120
    )
    dead = int(out.stdout)
    assert _states(url, study)[dead] == ("RUNNING", None)
    run_local(tune, 2, 3, {"storage": url, "tune_warmup": 0}, False, timeout_s=300)
    state, why = _states(url, study)[dead]
    assert state == "FAIL" and "the job that ran it ended: its process (pid" in str(why), why
