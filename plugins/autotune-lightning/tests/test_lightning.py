"""The Lightning callback for real: 2 CPU ranks on gloo, Lightning's own DDP strategy."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import torch
from lightning_jobs import STEPS, fit

import autotune
from autotune.comm.launch import run_local

pytestmark = pytest.mark.distributed


def test_the_callback_trains_through_autotune_like_plain_ddp(tmp_path: Path) -> None:
    config = autotune.Config(storage=f"sqlite:///{tmp_path / 'plans.db'}")
    tuned = run_local(fit, 2, str(tmp_path / "tuned"), config, timeout_s=300)
    plain = run_local(fit, 2, str(tmp_path / "plain"), None, timeout_s=300)
    for rank in tuned:
        assert rank["messages"] > 0  # every bucket went through autotune's engine
        assert rank["plan"]  # and has a plan per size class
    # Bitwise identical across ranks, and the same job without autotune within 1e-5.
    mine = tuned[0]["parameters"]
    assert all(torch.equal(a, b) for a, b in zip(mine, tuned[1]["parameters"], strict=True))
    for a, b in zip(mine, plain[0]["parameters"], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a - b).abs().max()
    # Lightning's logger got autotune's values every step, and the plan at the end.
    log_dir = Path(tuned[0]["log_dir"])
    with open(log_dir / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("autotune/iterations")]
    # The engine's count: at a step's end its last bucket may still be finishing.
    assert [float(r["autotune/iterations"]) for r in rows][-1] in (STEPS - 1, STEPS)
    assert {r["autotune/locked"] for r in rows} <= {"0.0", "1.0"}
    # Whether the decision is final: never before the plan is locked.
    assert {r["autotune/final"] for r in rows} <= {"0.0", "1.0"}
    assert all(r["autotune/locked"] == "1.0" for r in rows if r["autotune/final"] == "1.0")
    hparams = (log_dir / "hparams.yaml").read_text()
    assert "autotune/plan:" in hparams and "fusion:" in hparams
    # Rank 0 said the plain verdict first, then the plan, then the comparison in full.
    said = tuned[0]["said"]
    assert len(said) == 3, said
    assert re.fullmatch(r"autotune: (\d\.\d\dx step time: faster|no gain|provisional: ).*", said[0])
    assert said[1].startswith("autotune plan: ") and "fusion:" in said[1]
    provisional = said[0].startswith("autotune: provisional: ")
    verdict = "autotune vs plain DDP, provisional: " if provisional else "autotune vs plain DDP: "
    assert said[2].startswith(verdict), said
    assert tuned[1]["said"] == []  # once, on rank 0
