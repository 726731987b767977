"""The tuner and unhooking on the played NCCL (autotune.testing.played_nccl), launches jittered so
that each rank's threads race differently: whatever autotune launches on NCCL, from whichever
thread, must come in one order on every rank, or the played NCCL fails the job (a GPU would
hang it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tuner_jobs import KEEPS_SWITCHING, tune
from unhook_jobs import KEEPS_BASELINE, beside_plain

from autotune.comm.launch import run_local
from autotune.testing import played_nccl

pytestmark = pytest.mark.distributed
#: Up to 2 ms before each launch, a different sequence on each rank.
ON: dict[str, Any] = {
    "backend": played_nccl.BACKEND,
    "setup": played_nccl.install,
    "env": {played_nccl.JITTER_ENV: "0.002"},
}


def test_plans_that_keep_changing_launch_in_one_order_on_every_rank(tmp_path: Path) -> None:
    # Fusion tuned too: the plan keeps moving between the lane (the backend's own, DDP's
    # buckets) and autotune's threads (point-to-point schedules, fused and cut messages) while
    # the tuner exchanges.
    config = {**KEEPS_SWITCHING, "storage": f"sqlite:///{tmp_path / 'tuning.db'}"}
    runs = run_local(tune, 3, 200, config, True, timeout_s=900, **ON)
    sequences = [r.messages for r in runs]
    assert all(s == sequences[0] for s in sequences), "ranks ran different algorithms"
    ran = {a for _, _, a, _ in sequences[0]}
    assert {"native"} < ran, ran  # the lane and the point-to-point schedules both ran
    # DDP's buckets are 66144 and 1052672 bytes: fused into one message, and cut in two.
    sizes = {n for _, n, _, _ in sequences[0]}
    assert any(n > 1052672 for n in sizes) and any(66144 < n < 1052672 for n in sizes), sizes
    assert len({r.hooked for r in runs}) == 1, "ranks' parameters diverged"
    assert runs[0].plain_rel < 1e-5, runs[0].plain_rel


def test_explore_lock_unhook_and_check_plain_ddp_in_one_order(tmp_path: Path) -> None:
    config = {**KEEPS_BASELINE, "storage": f"sqlite:///{tmp_path / 'tuning.db'}"}
    runs = run_local(
        beside_plain, 2, "base", 400, "register", config, None, 10, timeout_s=600, **ON
    )
    assert {r.aside_at for r in runs} != {None}, [r.refused for r in runs]
    assert len({r.aside_at for r in runs}) == 1
    assert all(r.reducer_replaced and r.hooks_left == 0 for r in runs)
    assert runs[0].hooked == runs[0].plain and runs[1].hooked == runs[1].plain
