"""Every algorithm that runs on NCCL, on the played NCCL (autotune.testing.played_nccl): directly,
and through the hook against DDP's own gradients, at 2 and 3 ranks; NCCL's rules kept, every
launch checked for one order on every rank. What test_cuda.py runs on a GPU, run in CI."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import torch
from ddp_jobs import digest, faulty_training, train_all

from autotune.comm.launch import launch, run_local
from autotune.testing import played_nccl
from autotune.testing.conformance import (
    Case,
    algorithms_under_test,
    failures,
    run_conformance,
    runnable_on,
)

pytestmark = pytest.mark.distributed
ON: dict[str, Any] = {"backend": played_nccl.BACKEND, "setup": played_nccl.install}
#: NCCL's watchdog ends a rank 10 s after a failure here (4 x 2.5 s; a minute by default).
QUICK_WATCHDOG = {played_nccl.DUMP_WAIT_ENV: "2500"}
#: What runs on NCCL; one of NCCL's own algorithm x protocol cells stands for all (the played
#: NCCL consults no tuner plugin: autotune-nccl's own tests play that).
NAMES = runnable_on("nccl/cuda", algorithms_under_test())


def _cases(world_size: int) -> list[Case]:
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for numel in (0, 1, world_size + 1, 4099, 300_001):
            out.append(Case(numel, dtype))
        out.append(Case(300_001, dtype, segment_bytes=64 << 10))
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_algorithm_sums_right(world_size: int) -> None:
    assert {"native", "ring", "tree", "two_tree", "hierarchical_ring"} <= set(NAMES)
    assert "shm" not in NAMES  # CPU tensors on gloo only
    got = run_conformance(world_size, NAMES, case_list=_cases(world_size), **ON)
    problems = failures(got)
    assert not problems, "\n".join(problems[:20])


def test_through_the_hook_the_gradients_are_ddps_own() -> None:
    per_rank = run_local(train_all, 2, NAMES, ["base"], "cpu", timeout_s=600, **ON)
    # The played NCCL never asks autotune's tuner plugin: its cells are refused at register
    # (they would run NCCL's own choice under their name); the rest run.
    refused = {t.algorithm for t in per_rank[0] if t.refused is not None}
    assert refused == {n for n in NAMES if n.startswith("nccl.")} and refused, refused
    for i, t in enumerate(per_rank[0]):
        if t.refused is not None:
            assert "cannot run its own schedule on this job (nccl backend" in t.refused, t.refused
            continue
        assert t.algorithms_used == {t.algorithm}  # every message ran the algorithm fixed
        for hooked, plain in zip(t.hooked, t.plain, strict=True):
            rel = float((hooked.double() - plain.double()).norm() / plain.double().norm())
            assert rel <= 1e-5, f"{t.algorithm}: {rel:.2e} from DDP without the hook"
        assert len({digest(ts[i].hooked) for ts in per_rank}) == 1, f"{t.algorithm}: ranks differ"


@pytest.mark.parametrize(
    ("algorithm", "fault"), [("ring", "exit"), ("native", "exit"), ("ring", "exit_seen")]
)
def test_a_dead_rank_is_named_to_every_survivor(algorithm: str, fault: str) -> None:
    # "exit_seen": the survivors launch once gloo has seen rank 2's connections close, where
    # gloo fails a send at once and NCCL still launches it (the watchdog must end them alike).
    results = launch(
        faulty_training, 3, algorithm, fault, 2, 60.0, timeout_s=120, grace_s=60,
        env=QUICK_WATCHDOG, **ON,
    )  # fmt: skip
    assert results[2].exitcode == 17
    for r in results[:2]:
        assert r.ok, r.error
        # Each survivor had its PeerError, then NCCL's watchdog ended it, as on a GPU.
        assert r.exitcode == -signal.SIGABRT, r
        seen = r.value
        assert (seen.step, seen.kind, seen.rank) == (5, "PeerError", 2), seen
        assert "rank 2 failed first (its process exited" in seen.message


def test_a_stalled_rank_fails_the_others_at_their_timeout_with_one_culprit() -> None:
    # NCCL's wait with a timeout blocks the host, then raises: the survivors give up at theirs.
    results = launch(
        faulty_training, 3, "ring", "stall", 2, 4.0, timeout_s=120, grace_s=30,
        env=QUICK_WATCHDOG, **ON,
    )  # fmt: skip
    survivors = [r.value for r in results[:2]]
    assert all(r.ok for r in results[:2]), [r.error for r in results[:2]]
    assert [r.exitcode for r in results[:2]] == [-signal.SIGABRT] * 2
    for f in survivors:
        assert (f.kind, f.step) == ("PeerError", 5) and "0:00:04" in f.message, f
    assert survivors[0].rank == survivors[1].rank is not None
