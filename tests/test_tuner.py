"""The live tuner on spawned ranks: choices follow measurements, ranks never disagree, plans last.

Algorithms with injected delays (tests/tuner_jobs.py) make the right answers known in advance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tuner_jobs import SMALL_BYTES, fixed_from_file, register_with_plan_file, tune

from autotune.launch import run_local
from autotune.plan import Choice, Entry, Table, size_class
from autotune.store import Store

QUICK = {"tune_warmup": 1, "tune_samples": 2, "fusion_bytes": 0}


def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuning.db'}"


def test_a_deliberately_slow_algorithm_stops_being_chosen(tmp_path: Path) -> None:
    config = {**QUICK, "algorithms": ("ring", "slow_ring"), "storage": storage(tmp_path)}
    runs = run_local(tune, 2, 60, config, False, timeout_s=600)
    result = runs[0]
    assert result.settled, result.progress
    assert result.plan and all(c.algorithm == "ring" for c in result.plan.values()), result.plan
    last = max(i for i, *_ in result.messages)
    assert all(a == "ring" for i, _, a, _ in result.messages if i == last)


def test_the_best_algorithm_differs_between_size_classes(tmp_path: Path) -> None:
    config = {**QUICK, "algorithms": ("fast_small", "fast_large"), "storage": storage(tmp_path)}
    result = run_local(tune, 2, 60, config, False, timeout_s=600)[0]
    assert result.settled, result.progress
    sizes: dict[int, set[int]] = {}
    for _, nbytes, _, _ in result.messages:
        sizes.setdefault(size_class(nbytes), set()).add(nbytes)
    expected = {
        cls: "fast_small" if max(sizes[cls]) <= SMALL_BYTES else "fast_large" for cls in result.plan
    }
    assert {cls: c.algorithm for cls, c in result.plan.items()} == expected
    assert set(expected.values()) == {"fast_small", "fast_large"}  # both kinds of class occur


def test_ranks_switch_together_for_hundreds_of_steps(tmp_path: Path) -> None:
    # No warm-up, one sample a trial, and re-tuning on any 1% slowdown: the plan keeps changing.
    config = {
        "tune_warmup": 0,
        "tune_samples": 1,
        "drift_ratio": 1.01,
        "algorithms": ("native", "ring", "tree", "two_tree"),
        "storage": storage(tmp_path),
    }
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


def test_a_restarted_job_starts_from_the_stored_plan(tmp_path: Path) -> None:
    url = storage(tmp_path)
    config = {"tune_warmup": 0, "tune_samples": 2, "algorithms": ("native", "tree"), "storage": url}
    # fusion_bytes is left to the tuner too.
    first = run_local(tune, 2, 80, config, False, timeout_s=600)[0]
    assert first.settled, first.progress
    trials = Store(url).trial_count()
    assert trials > 0
    second = run_local(tune, 2, 25, config, False, timeout_s=600)[0]
    assert Store(url).trial_count() == trials  # nothing explored again
    assert second.settled
    assert {p.state for p in second.progress.values()} == {"locked"}
    assert second.fusion_bytes == first.fusion_bytes
    assert {cls: second.plan[cls] for cls in first.plan if cls in second.plan} == {
        cls: c for cls, c in first.plan.items() if cls in second.plan
    }


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
        ("{oops", "is not JSON"),
        (None, "cannot read plan file"),
    ],
)
def test_a_bad_plan_file_fails_at_register_naming_the_file(
    tmp_path: Path, content: str | None, words: str
) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    for message in run_local(register_with_plan_file, 2, str(path)):
        assert f"plan file {str(path)!r}" in message and words in message, message
