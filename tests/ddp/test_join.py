"""DDP's ``Join`` (uneven inputs) in every phase of ``auto``, at 3 ranks.

A rank that has joined runs no forward: what autotune does from the model's forward pre-hook
(unhooking, the check against plain DDP, DDP's bucket-size search) holds while a Join is open,
on every rank alike, and goes on after it (`autotune.ddp.join`); an unhook that is due happens,
on a rank that has joined in its shadow of the same iteration. Before, once autotune had
unhooked, the bucket-size search's all-reduce in the pre-hook met the joined rank's Join
collectives: gloo's "Timed out waiting ... for recv" and "the failed rank is unknown".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_jobs import RING_WORKLOAD, plan_that_steps_aside, storage_with_a_ring_plan
from join_jobs import uneven

from autotune.comm.launch import run_local

pytestmark = pytest.mark.distributed

PHASES = ["screening", "catch", "unhook due", "unhook after a rank joined", "buckets", "unhooked"]


def _config(phase: str, tmp_path: Path) -> dict[str, object]:
    config: dict[str, object] = {"timeout_s": 20.0}
    if phase in ("unhook due", "unhooked"):
        config["plan_file"] = plan_that_steps_aside(tmp_path / "plan.json")
    elif phase == "catch":
        config["storage"] = storage_with_a_ring_plan(tmp_path / "ring.db", 3)
        config["workload"] = RING_WORKLOAD
    else:
        config["storage"] = f"sqlite:///{tmp_path / 'plans.db'}"
    if phase in ("buckets", "unhook after a rank joined"):
        # The baseline alone: locked soon (~100 iterations), unhooked, then DDP's buckets.
        config.update(algorithms=("native",), tune_warmup=0, tune_samples=1)
    return config


@pytest.mark.parametrize("phase", PHASES)
def test_uneven_inputs_under_join_train_as_plain_ddp(phase: str, tmp_path: Path) -> None:
    results = run_local(uneven, 3, phase, _config(phase, tmp_path), timeout_s=600)
    assert len({r.phase_at for r in results}) == 1  # every rank reached it at the same step
    for r in results:
        assert r.rel < 1e-5, r
    if phase in ("catch", "buckets"):
        # The pre-hook held through the Join on every rank, and went on after it.
        assert all(r.held > 0 for r in results), results
    if phase == "unhook due":  # the plan file's, after the first iteration: inside the Join
        assert [r.unhooked_at for r in results] == [1, 1, 1], results
    if phase == "unhook after a rank joined":
        # Rank 1 joined after 4 batches; the tuner unhooked later, inside the Join (rank 0 trains
        # on until it has), rank 1 in its shadow of the same iteration as the others in their
        # forward.
        at = [r.unhooked_at for r in results]
        assert at[0] is not None and 4 < at[0] <= results[0].batches, results
        assert at == [at[0]] * 3, results
    if phase in ("catch", "buckets"):
        assert all(r.went_on > 0 for r in results), results
