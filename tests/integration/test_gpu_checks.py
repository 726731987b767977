"""benchmarks/gpu_checks.sh fits its lease: the plan against the budget, and a stop in the first
seconds, saying what is missing, before any device time goes on a run that cannot work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_checks.sh"


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, "PY": sys.executable, "OUT": str(tmp_path / "out"),
             "WORK": str(tmp_path / "work"), **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_default_plan_fits_the_documented_budget(tmp_path: Path) -> None:
    got = _run(tmp_path, "--plan", BUDGET_S="540")
    assert got.returncode == 0, got.stdout + got.stderr
    lines = dict(line.split()[:2] for line in got.stdout.splitlines() if line.strip())
    order = [line.split()[0] for line in got.stdout.splitlines()]
    # Most proof first: the hook and every algorithm on NCCL, then the example, the gain, the
    # plugins, NVML.
    assert order[:7] == [
        "setup",
        "nccl-tests",
        "example-nccl",
        "gain-nccl",
        "plugins",
        "env",
        "total",
    ]
    caps = [int(lines[p]) for p in order[:6]]
    assert int(lines["total"]) == sum(caps) <= 540 - 60


def test_a_plan_over_the_budget_exits_non_zero_saying_by_how_much(tmp_path: Path) -> None:
    got = _run(tmp_path, "--plan", "nccl-tests", "gain-gloo", "faults-nccl", BUDGET_S="540")
    assert got.returncode == 1
    assert "over the budget by 80 s" in got.stdout  # 40 + 90 + 280 + 150 = 560, against 480


def test_an_unknown_phase_is_refused(tmp_path: Path) -> None:
    got = _run(tmp_path, "--plan", "gain-nccl", "warp-drive")
    assert got.returncode == 2
    assert "unknown phase warp-drive" in got.stderr


def test_what_is_missing_stops_it_at_once_and_comes_back_in_the_summary(tmp_path: Path) -> None:
    got = _run(tmp_path, "--cpu", NCCL_XZ=str(tmp_path / "no-such-nccl.xz"))
    assert got.returncode == 1
    assert f"missing: {tmp_path / 'no-such-nccl.xz'}" in got.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "setup: FAILED" in summary and "no-such-nccl.xz" in summary
    assert (tmp_path / "out" / "gpu-checks.tgz").stat().st_size > 0
    assert not (tmp_path / "work" / "nccl-tests.out").exists()  # no phase ran
