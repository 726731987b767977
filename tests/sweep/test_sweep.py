"""`autotune sweep` on spawned gloo ranks: nccl-tests' table, the check, files, and --tune."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sweep_jobs import measured_order, sweep, sweep_with_a_dying_rank

from autotune.algorithms import available
from autotune.comm.launch import launch, run_local
from autotune.plan import size_class
from autotune.storage import SWEEP, Store
from autotune.sweep import Measured, SweepOptions, SweepResult, Variant, dtype_name, exact_limit
from autotune.sweep._measure import round_order

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["size", "count", "type", "algorithm", "segment", "time", "algbw", "busbw", "#wrong"]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def table_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line and not line.startswith("#")]


@pytest.mark.distributed
def test_the_table_reads_like_nccl_tests(tmp_path: Path) -> None:
    out = run_cli(
        "sweep",
        "--world-size",
        "3",
        "-b",
        "4",
        "-e",
        "64K",
        "-f",
        "16",
        "-n",
        "3",
        "-w",
        "1",
        "--p2p",
        "--json",
        "r.json",
        "--csv",
        "r.csv",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no progress bar when stderr is not a terminal
    head = [line for line in out.stdout.splitlines() if line.startswith("#") and "count" in line]
    assert head[0].lstrip("#").split() == COLUMNS
    rows = table_rows(out.stdout)
    names = list(available())
    sizes = [4, 64, 1024, 16384]  # -b 4 -e 64K -f 16
    # NCCL's own combinations (autotune-nccl) are left out on gloo, which steers none of them.
    on_gloo = [a for a in SweepOptions().swept if not a.startswith("nccl.")]
    assert [(int(r[0]), r[3]) for r in rows] == [(s, a) for s in sizes for a in on_gloo]
    assert set(SweepOptions().swept) == set(names)  # plugins (direct, star, nccl.*) included
    assert "nccl.ring.ll128" in names and {"direct", "star"} <= set(on_gloo)
    for r in rows:
        assert len(r) == len(COLUMNS)
        size, count, time_us, algbw, busbw = int(r[0]), int(r[1]), *map(float, (r[5], r[6], r[7]))
        assert (count, r[2], r[8]) == (size // 4, "float", "0")  # every algorithm sums right
        assert time_us > 0 and busbw == pytest.approx(algbw * 4 / 3, abs=0.011)
    avg = re.findall(r"^# Avg bus bandwidth\s+: (\S+) (\S+)$", out.stdout, re.M)
    assert [name for _, name in avg] == on_gloo
    assert "# Wrong elements       : 0 OK" in out.stdout
    assert "# Point-to-point ceiling" in out.stdout

    result = SweepResult.load(str(tmp_path / "r.json"))
    assert result.world_size == 3 and result.wrong == 0
    for row in result.rows:
        assert row.algbw_gbps == pytest.approx(row.bytes / row.time_us / 1e3)
        assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 2 * 2 / 3)
        assert len(row.times_us) == 3 and row.time_us == sorted(row.times_us)[1]
    assert [(r.bytes, r.wrong) for r in result.p2p] == [(s, 0) for s in sizes]
    assert all(r.busbw_gbps == r.algbw_gbps for r in result.p2p)  # sendrecv: no bus factor
    with open(tmp_path / "r.csv") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(sizes) * (len(on_gloo) + 1)
    assert {line["algorithm"] for line in lines} == {*on_gloo, "p2p"}
    assert {line["wrong"] for line in lines} == {"0"}


@pytest.mark.distributed
def test_the_check_catches_a_broken_algorithm(tmp_path: Path) -> None:
    options = {
        "min_bytes": 8,
        "max_bytes": 4096,
        "step_factor": 8,
        "iters": 1,
        "warmup": 0,
        "check": 2,
        "algorithms": ("ring", "loses_last_element"),
    }
    result = SweepResult.from_json(run_local(sweep, 4, options, None)[0])
    wrong = {(r.algorithm, r.bytes): r.wrong for r in result.rows}
    assert {w for (a, _), w in wrong.items() if a == "ring"} == {0}
    broken = [w for (a, _), w in wrong.items() if a == "loses_last_element"]
    assert all(w is not None and w % 2 == 0 for w in broken)  # per checked iteration alike
    assert sum(w or 0 for w in broken) > 0 and result.wrong == sum(w or 0 for w in broken)


@pytest.mark.distributed
def test_a_dead_rank_is_a_peer_error_on_the_others_not_a_hang(tmp_path: Path) -> None:
    options = {
        "min_bytes": 8,
        "max_bytes": 8,
        "iters": 2,
        "warmup": 0,
        "check": 0,
        "timeout_s": 10.0,
        "algorithms": ("dies_on_rank_one",),
    }
    start = time.monotonic()
    results = launch(sweep_with_a_dying_rank, 3, options, str(tmp_path), timeout_s=120, grace_s=60)
    assert results[1].exitcode == 17
    for r in (results[0], results[2]):
        assert r.ok, r.error
        assert "autotune sweep bookkeeping: the barrier failed or did not finish" in r.value
    assert time.monotonic() - start < 60


@pytest.mark.distributed
def test_the_json_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    options = {"min_bytes": 4, "max_bytes": 256, "iters": 2, "warmup": 0, "p2p": True}
    raw = run_local(sweep, 2, options, str(path))[0]
    result = SweepResult.from_json(raw)
    assert SweepResult.load(str(path)) == result
    assert SweepResult.from_json(result.to_json()) == result
    assert result.command == "test" and result.options["max_bytes"] == 256
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not an autotune sweep result"):
        SweepResult.load(str(tmp_path / "bad.json"))


@pytest.mark.distributed
def test_tune_writes_a_plan_the_hook_starts_from(tmp_path: Path) -> None:
    from tuner_jobs import tune as train

    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    options: dict[str, Any] = {
        "min_bytes": 512,
        "max_bytes": 4 << 20,
        "iters": 3,
        "warmup": 1,
        "tune": True,
        "tune_algorithms": ("native", "tree"),
        "algorithms": ("native", "tree"),
        "storage": url,
    }
    result = SweepResult.from_json(run_local(sweep, 2, options, None)[0])
    assert result.plan is not None and result.plan_key is not None
    classes = {size_class(s) for s in (512 << i for i in range(14))}
    assert set(result.plan.classes) == classes
    assert {e.state for e in result.plan.classes.values()} == {"locked"}
    assert result.wrong == 0
    tuned = [r for r in result.rows if r.algorithm == "tuned"]
    assert [r.chosen for r in tuned] == [
        result.plan.classes[size_class(r.bytes)].choice.algorithm for r in tuned
    ]
    store = Store(url)
    # Stored as the sweep's classes, not as any job's plan.
    assert store.tables() == {(result.plan_key, SWEEP): result.plan}
    # The result knows the fingerprint it was stored under (a job's, and the prior's key).
    from autotune.storage import fingerprint_key

    assert fingerprint_key(result.fingerprint()) == result.plan_key
    # The cost model's fit to the sweep is stored too, as the live tuner's prior.
    from autotune.model import Prior, Shape, fit, predict
    from autotune.sweep import samples_from_sweep

    stored = store.load_prior(result.plan_key)
    assert stored is not None
    prior, fitted = Prior.from_json(stored), fit(samples_from_sweep(result))
    # The same fit, to rounding: with one modelled algorithm (tree) its bytes sent and summed
    # are proportional, and how the solver splits them between beta and gamma may differ in
    # the last digits from one process to another. Its predictions may not.
    # Its error bound is over what it may leave out: tree here, never native.
    assert prior.worst_error == pytest.approx(fitted.worst_error("tree"), rel=1e-6)
    for s in fitted.samples:
        mine = predict(s.algorithm, s.nbytes, Shape(2, 2), prior.params, s.segment_bytes)
        theirs = predict(s.algorithm, s.nbytes, Shape(2, 2), fitted.params, s.segment_bytes)
        assert mine == pytest.approx(theirs, rel=1e-6)
    trials = store.trial_count()
    # Every trial records the choice it measured, as the live tuner's do.
    import optuna

    for name in optuna.study.get_all_study_names(storage=store.storage):
        if "/sweep/class=" in name:
            study = optuna.load_study(study_name=name, storage=store.storage)
            assert all("algorithm" in t.params for t in study.trials), name

    # A job with the same setting (2 gloo ranks, CPU, float32) screens nothing: the sweep's
    # classes stand in for its screening, and each class's choice where it is not the baseline's
    # meets the job's plan in a paired test on the step, and wins. (The baseline is slowed down
    # here, through the hook, so that any plan that differs from it wins; where the sweep chose
    # native, no paired test is run for the class. unhook is off: a job that unhooks would take
    # a plan that needs the hook to plain DDP itself instead, which is not slowed:
    # tests/tuning/test_plain_check.py.)
    config = {"tune_warmup": 0, "tune_samples": 2, "fusion_bytes": 0, "storage": url}
    config["unhook"] = False
    config.update(algorithms=("native", "tree"), max_pairs=6)
    job = run_local(train, 2, 400, config, False, True, None, True, timeout_s=600)[0]
    assert job.settled, (job.progress, job.duels)
    assert store.trial_count() == trials
    # No fusion round, no screening: where the sweep chose other than native for two or more
    # classes, those choices meet the baseline together first ("joint": docs/TUNER.md, "The
    # classes together first"); else, or where that lost, class paired tests (one per class),
    # and where two or more won, each against the plan before it, the plan they make meets the
    # baseline once ("confirm").
    kinds = [kind for kind, _, _ in job.duels]
    assert set(kinds) <= {"joint", "class", "combined", "confirm"}, job.duels
    assert "joint" not in kinds[1:], job.duels
    assert ("confirm" in kinds) == (kinds.count("class") >= 2), job.duels
    assert all(won for _, _, won in job.duels), job.duels
    assert job.plan and all(c == result.plan.classes[cls].choice for cls, c in job.plan.items())
    # The job stored a plan of its own; the sweep's classes are as the sweep left them.
    tables = store.tables()
    assert tables[result.plan_key, SWEEP] == result.plan
    ((stored_as, own),) = [(k, t) for k, t in tables.items() if k[1] != SWEEP]
    assert stored_as[0] == result.plan_key and stored_as[1].startswith("layout-")
    # Its plan holds the classes it sent, not the sweep's others (nor does its verdict name them).
    assert set(own.classes) == {size_class(n) for i, n, *_ in job.messages if i > 0}


def test_options_follow_nccl_tests() -> None:
    assert SweepOptions(min_bytes=4, max_bytes=64, dtype="double").counts() == [0, 1, 2, 4, 8]
    assert SweepOptions(min_bytes=1 << 20, max_bytes=3 << 20, step_factor=None).counts() == [
        (1 << 20) // 4,
        (2 << 20) // 4,
        (3 << 20) // 4,
    ]
    assert dtype_name("bf16") == "bfloat16" and dtype_name("torch.float16") == "half"
    with pytest.raises(ValueError, match="choose one of float, double, half, bfloat16"):
        SweepOptions(dtype="int32")
    with pytest.raises(ValueError, match="-e < -b"):
        SweepOptions(min_bytes=1024, max_bytes=8)
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        SweepOptions(algorithms=("ring", "nope"))
    with pytest.raises(ValueError, match="NCCL reduces CUDA tensors"):
        SweepOptions(backend="nccl", device="cpu")
    assert exact_limit(SweepOptions(dtype="bf16").torch_dtype) == 256


@pytest.mark.distributed
def test_bad_flags_get_a_clear_error(tmp_path: Path) -> None:
    out = run_cli("sweep", "-f", "2", "-i", "1M", cwd=tmp_path)
    assert out.returncode == 2 and "not both" in out.stderr
    out = run_cli("sweep", "-d", "int8", cwd=tmp_path)
    assert out.returncode == 2 and "unsupported dtype 'int8'" in out.stderr
    out = run_cli("sweep", "-b", "64Q", cwd=tmp_path)
    assert out.returncode == 2 and "not a byte count" in out.stderr


@pytest.mark.distributed
def test_report_plots_sweeps_and_prints_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    options: dict[str, Any] = {"min_bytes": 4, "max_bytes": 4096, "iters": 2, "warmup": 0}
    options |= {"p2p": True, "tune": True, "storage": f"sqlite:///{tmp_path / 't.db'}"}
    options["step_factor"] = 16
    run_local(sweep, 2, options, str(path))
    out = run_cli("report", str(path), str(path), "-o", "busbw.png", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    png = (tmp_path / "busbw.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert "| size class | algorithm |" in out.stdout
    assert out.stdout.count("| 1 KiB |") == 2  # one plan per file: classes 4 B, 64 B, 1 KiB


@pytest.mark.distributed
def test_torchrun_ranks_are_used(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    out = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            f"--log-dir={tmp_path / 'logs'}",
            "-m",
            "autotune.cli",
            "sweep",
            "-b",
            "1K",
            "-e",
            "1K",
            "-n",
            "2",
            "--algorithms",
            "ring,native",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "# autotune sweep: all-reduce (sum, in place), 2 ranks" in out.stdout
    assert [(r[0], r[3], r[8]) for r in table_rows(out.stdout)] == [
        ("1024", "ring", "0"),
        ("1024", "native", "0"),
    ]
    assert io.StringIO(out.stdout).read().count("# autotune sweep") == 1  # rank 0 prints alone


@pytest.mark.distributed
def test_report_draws_the_models_fit_and_prints_its_error(tmp_path: Path) -> None:
    from autotune.model import fit
    from autotune.sweep import samples_from_sweep

    sweep = Path(__file__).resolve().parents[2] / "docs" / "sweeps" / "sweep-4.json"
    out = run_cli("report", str(sweep), "--model", "-o", "fit.png", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fitted = fit(samples_from_sweep(SweepResult.load(str(sweep))))
    tree = f"tree {fitted.median_error('tree'):.0%}/{fitted.worst_error('tree'):.0%}"
    assert f"model fitted to {sweep}: median/worst error native" in out.stdout
    assert tree in out.stdout


class _ScriptedBench:
    """Times from a script: per call, the seconds each variant (by label) takes every iteration."""

    def __init__(self, script: list[dict[str, float]], wrong: dict[str, int]) -> None:
        self.script = script
        self.wrong = wrong
        self.calls: list[tuple[list[str], int, int]] = []
        self.advanced = 0

    def progress(self, n: int) -> None:
        self.advanced += n

    def measure(
        self, count: int, variants: Any, *, iters: int, warmup: int, check: int
    ) -> Measured:
        labels = [v.label for v in variants]
        self.calls.append((labels, iters, check))
        times = self.script[len(self.calls) - 1]
        self.advanced += len(labels) * (check + warmup + iters)
        return Measured(
            [[times[label] for label in labels] for _ in range(iters)],
            [[0.0] * len(labels) for _ in range(iters)],
            [self.wrong.get(label, 0) for label in labels] if check else None,
        )


def test_tuning_times_close_choices_again_and_decides_on_all_their_samples() -> None:
    from autotune.sweep._tune import (
        FINAL_ROUNDS,
        FINAL_WITHIN,
        final_calls,
        finalists,
        time_choices,
    )

    variants = [Variant(label, "ring") for label in ("a", "b", "c", "bad")]
    # b is within FINAL_WITHIN of a at first; timed again, it is clearly faster. c is far
    # behind, and "bad" (fastest, but summing wrong) is never a finalist.
    first = {"a": 1.0, "b": 1.05, "c": 2.0, "bad": 0.5}
    assert FINAL_WITHIN >= 1.05
    bench = _ScriptedBench([first, {"a": 1.0, "b": 0.9}], {"bad": 3})
    samples, wrong = time_choices(bench, 1024, variants, iters=4, warmup=1)
    assert bench.calls == [(["a", "b", "c", "bad"], 4, 1), (["a", "b"], FINAL_ROUNDS * 4, 0)]
    assert wrong == [0, 0, 0, 3]
    assert [len(s) for s in samples] == [4 + FINAL_ROUNDS * 4, 4 + FINAL_ROUNDS * 4, 4, 4]
    # b's first 4 samples at 1.05 and 8 at 0.9: its median is 0.9, a's 1.0.
    import statistics

    assert statistics.median(samples[1]) == 0.9 and statistics.median(samples[0]) == 1.0
    # The progress bar ends where its total said: every call counted, the unused budget too.
    assert bench.advanced == 4 * (1 + 1 + 4) + final_calls(4, 1)
    # One clear winner: no second timing.
    bench = _ScriptedBench([{"a": 1.0, "b": 1.5}], {})
    samples, _ = time_choices(bench, 1024, variants[:2], iters=4, warmup=1)
    assert len(bench.calls) == 1 and [len(s) for s in samples] == [4, 4]
    assert bench.advanced == 2 * (1 + 1 + 4) + final_calls(4, 1)
    # At most FINALISTS, fastest first.
    assert finalists([1.0, 1.01, 1.02, 1.03, 1.04, 1.5]) == [0, 1, 2, 3]
    assert finalists([1.2, 1.0, 1.05]) == [1, 2]
    assert finalists([1.0]) == [] and finalists([]) == []


@pytest.mark.distributed
def test_each_round_runs_the_variants_in_an_order_of_its_own_the_same_on_every_rank() -> None:
    # In a fixed order a variant always inherits what the one before it leaves behind.
    rounds = 24
    orders = [round_order(4, r) for r in range(rounds)]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    assert orders == [round_order(4, r) for r in range(rounds)]  # reproducible
    for v in range(4):
        assert {o.index(v) for o in orders} == {0, 1, 2, 3}  # at every place
        before = {o[o.index(v) - 1] for o in orders if o.index(v) > 0}
        assert before == {0, 1, 2, 3} - {v}  # after every other
    # What Bench.measure ran, call by call, on both ranks: those orders.
    per_rank = run_local(measured_order, 2, rounds, timeout_s=120)
    expected = [(k + 1) * 1024 for o in orders for k in o]
    for calls, timed in per_rank:
        assert calls == expected and timed == rounds - 1


def test_the_sweep_table_keeps_its_columns_for_the_longest_names() -> None:
    # hierarchical_two_tree (21 characters) overflowed the 18-wide algorithm column.
    from autotune.sweep._format import columns, row_line
    from autotune.sweep._result import Row

    head = columns()[0]
    end = head.index("algorithm") + len("algorithm")
    for algorithm, chosen in (("hierarchical_two_tree", None), ("tuned", "hierarchical_two_tree"),
                              ("ring", None)):  # fmt: skip
        row = Row(1 << 20, 1 << 18, "float", algorithm, None, 10.0, 1.0, 1.5, 0, chosen=chosen)
        line = row_line(row)
        label = algorithm if chosen is None else f"{algorithm}:{chosen}"
        assert line.index(label) + len(label) == end, (head, line)
        assert len(line) == len(head)
