"""Accelerate and the Transformers Trainer for real: 2 CPU ranks on gloo, each framework's own DDP
preparation, the same job with and without autotune."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_jobs import STEPS, accelerate_job, trainer_job

import autotune
from autotune.comm.launch import run_local

pytestmark = pytest.mark.distributed


def same_training(tuned: list[dict[str, Any]], plain: list[dict[str, Any]]) -> None:
    """Bitwise identical across ranks; within 1e-5 relative of the job without autotune."""
    mine = tuned[0]["parameters"]
    for other in tuned[1:]:
        assert all(torch.equal(a, b) for a, b in zip(mine, other["parameters"], strict=True))
    for a, b in zip(mine, plain[0]["parameters"], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a - b).abs().max()
    for rank in tuned:
        assert rank["messages"] > 0  # the buckets went through autotune's engine
        assert rank["plan"]


def test_accelerate_with_gradient_accumulation(tmp_path: Path) -> None:
    config = autotune.Config(storage=f"sqlite:///{tmp_path / 'plans.db'}")
    tuned = run_local(accelerate_job, 2, config, timeout_s=300)
    plain = run_local(accelerate_job, 2, None, timeout_s=300)
    same_training(tuned, plain)
    # One all-reduce per optimizer step: the accumulating backward passes sent nothing.
    assert [r["iterations"] for r in tuned] == [STEPS, STEPS]


def test_the_trainer_callback(tmp_path: Path) -> None:
    config = autotune.Config(storage=f"sqlite:///{tmp_path / 'plans.db'}")
    tuned = run_local(trainer_job, 2, str(tmp_path / "tuned"), config, timeout_s=300)
    plain = run_local(trainer_job, 2, str(tmp_path / "plain"), None, timeout_s=300)
    same_training(tuned, plain)
    # autotune's values reach the callbacks after it (report_to's integrations) with each log.
    logs = [entry for entry in tuned[0]["logged"] if "loss" in entry]
    assert len(logs) == STEPS // 5
    assert [entry["autotune/iterations"] for entry in logs] == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
    assert not any("autotune/iterations" in entry for entry in plain[0]["logged"])
