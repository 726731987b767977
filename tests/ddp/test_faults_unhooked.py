"""The fault contract wherever autotune is: hooked, unhooked, and when the store's host hangs.

Real ranks on gloo over 127.0.0.1 (`autotune.comm.launch`), a fault at a set step: a rank killed
("exit"), stopped (SIGSTOP: alive, hung), or hung in Python ("sleep": its heartbeat goes on).
Every survivor must get the same `PeerError` naming the culprit, from backward(), within
``timeout_s`` and the stated margin (docs/FAULTS.md); a stopped culprit, woken, agrees.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from fault_jobs import (
    RING_WORKLOAD,
    Seen,
    plan_that_steps_aside,
    storage_with_a_ring_plan,
    train_until_it_fails,
)

from autotune.comm.launch import launch
from autotune.testing import played_nccl

pytestmark = pytest.mark.distributed

TIMEOUT_S = 4.0
#: What the contract allows past timeout_s (docs/FAULTS.md): the diagnosis's store calls are
#: bounded by min(5 s, timeout_s), the heartbeats read 2.5 periods apart. Generous: a hang bound.
MARGIN_S = 15.0


def run(
    world_size: int, faults: dict[int, str], config: dict[str, Any], **options: Any
) -> list[Seen | None]:
    wake = options.pop("wake", False)
    when = options.pop("when", "8")
    buffers = options.pop("buffers", False)
    results = launch(
        train_until_it_fails,
        world_size,
        faults,
        {"timeout_s": TIMEOUT_S, **config},
        when,
        wake,
        buffers,
        timeout_s=120,
        grace_s=60,
        **options,
    )
    for r in results:
        if r.rank not in faults or (wake and faults[r.rank] == "stop"):
            assert r.ok, r.error
    return [r.value if r.ok else None for r in results]


def named(seen: Seen | None, culprit: int, within_s: float = TIMEOUT_S + MARGIN_S) -> Seen:
    """``seen``, checked: the `PeerError` that names ``culprit``, at the faulty step, in time."""
    assert seen is not None
    assert (seen.kind, seen.rank, seen.step) == ("PeerError", culprit, seen.fault_at), seen
    assert f"rank {culprit} failed first" in seen.message, seen.message
    assert seen.seconds < within_s, seen
    return seen


@pytest.fixture
def unhooking(tmp_path: Path) -> dict[str, Any]:
    return {"plan_file": plan_that_steps_aside(tmp_path / "plan.json")}


def test_stepped_aside_a_killed_rank_is_named_on_every_survivor(unhooking: dict[str, Any]) -> None:
    seen = run(3, {1: "exit"}, unhooking)
    for s in (seen[0], seen[2]):
        s = named(s, 1, within_s=TIMEOUT_S)  # closed connections: no timeout to wait out
        assert s.aside_at == 1 and s.ddp_group.startswith("autotune_ddp"), s
        assert "its process exited" in s.message


def test_on_nccl_stepped_aside_a_killed_rank_is_named_then_the_watchdog_ends_the_survivor(
    unhooking: dict[str, Any],
) -> None:
    # As on an H200 (docs/BENCHMARKS.md, "On a GPU"): on NCCL DDP runs on the job's group once
    # autotune unhooked; its failed all-reduce is named, then NCCL's watchdog ends the process.
    results = launch(
        train_until_it_fails, 2, {1: "exit"}, {"timeout_s": TIMEOUT_S, **unhooking}, "8",
        timeout_s=120, grace_s=60, backend=played_nccl.BACKEND, setup=played_nccl.install,
        env={played_nccl.DUMP_WAIT_ENV: "2500"},
    )  # fmt: skip
    survivor = results[0]
    assert survivor.ok, survivor.error
    seen = named(survivor.value, 1, within_s=TIMEOUT_S)
    assert seen.aside_at == 1 and "its process exited" in seen.message, seen
    assert not seen.ddp_group.startswith("autotune_ddp"), seen  # the job's own group on NCCL
    assert survivor.exitcode == -signal.SIGABRT


def test_where_ddps_forward_fails_first_the_next_call_names_the_culprit(
    unhooking: dict[str, Any],
) -> None:
    # The documented exception (docs/FAULTS.md): DDP broadcasts its buffers in forward(); rank
    # 0, broadcasting to the dead rank 1, gets gloo's error from forward() itself (a forward
    # hook cannot replace it), diagnosed at once: its next call raises the PeerError.
    seen = run(3, {1: "exit"}, unhooking, buffers=True)
    s0, s2 = seen[0], seen[2]
    assert s0 is not None and s0.in_forward and s0.kind == "RuntimeError", s0
    assert s0.then == ("PeerError", 1), s0
    assert named(s2, 1, within_s=TIMEOUT_S).then is None  # backward() named it directly


def test_stepped_aside_by_the_tuner_a_killed_rank_is_named(tmp_path: Path) -> None:
    # The usual way to unhook: the tuner kept the baseline (native only, quick trials).
    keeps_baseline = {"algorithms": ("native",), "fusion_bytes": 0, "tune_warmup": 0}
    config = {**keeps_baseline, "tune_samples": 1, "storage": f"sqlite:///{tmp_path / 't.db'}"}
    seen = run(3, {1: "exit"}, config, when="unhooked")
    for s in (seen[0], seen[2]):
        s = named(s, 1, within_s=TIMEOUT_S)
        assert s.aside_at is not None and s.ddp_group.startswith("autotune_ddp"), s


def test_in_the_catchs_blocks_of_plain_ddp_a_stopped_rank_is_named(tmp_path: Path) -> None:
    url = storage_with_a_ring_plan(tmp_path / "t.db", 2)
    config = {"algorithms": ("ring",), "storage": url, "max_pairs": 6, "workload": RING_WORKLOAD}
    seen = run(2, {1: "stop"}, config, when="catch", wake=True)
    named(seen[0], 1)
    assert seen[0] is not None and "its process is stopped" in seen[0].message
    named(seen[1], 1, within_s=120)


def test_stepped_aside_a_stopped_rank_is_named_at_the_timeout_and_agrees_once_woken(
    unhooking: dict[str, Any],
) -> None:
    seen = run(3, {1: "stop"}, unhooking, wake=True)
    for s in (seen[0], seen[2]):
        s = named(s, 1)
        assert s.seconds > TIMEOUT_S - 0.5, s  # a stop is a hang: it fails at timeout_s
        assert "its process is stopped" in s.message
    named(seen[1], 1, within_s=120)  # the culprit itself, after SIGCONT


def test_stepped_aside_a_rank_hung_in_python_is_named_by_its_progress(
    unhooking: dict[str, Any],
) -> None:
    seen = run(3, {2: "sleep"}, unhooking)
    for s in seen[:2]:
        assert "it had begun" in named(s, 2).message  # its heartbeat went on; it fell behind


def test_a_rank_stopped_on_native_is_named_alike_and_agrees_once_woken() -> None:
    seen = run(3, {1: "stop"}, {"algorithm": "native"}, wake=True)
    for r, s in enumerate(seen):
        s = named(s, 1, within_s=120 if r == 1 else TIMEOUT_S + MARGIN_S)
        assert s.aside_at is None and s.ddp_group == "default_pg", s


def test_a_stopped_rank_0_that_serves_the_store_is_named_alike_without_the_store() -> None:
    seen = run(3, {0: "stop"}, {"algorithm": "native"}, wake=True, store_on_rank0=True)
    for s in seen[1:]:
        assert "serves the rendezvous store, which did not answer" in named(s, 0).message
    # Woken, rank 0 finds the survivors' claim, written once its store answered again.
    named(seen[0], 0, within_s=120)


def test_a_stopped_rank_woken_after_the_stores_host_exited_names_itself() -> None:
    # Rank 0 serves the store, names rank 1, wakes it and exits with the store. The woken rank
    # once read its own local view ("rank 0 failed first ... it has exited"); it stood still
    # past timeout_s, so it is the rank its peers gave up on: it names itself, store or not.
    seen = run(3, {1: "stop"}, {"algorithm": "native"}, wake=True, store_on_rank0=True)
    for r, s in enumerate(seen):
        named(s, 1, within_s=120 if r == 1 else TIMEOUT_S + MARGIN_S)
