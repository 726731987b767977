"""The played NCCL's own rules (autotune.testing.played_nccl), each as NCCL has it: a coalesced
batch's one Work, the host blocked by a timed wait, and the one order of launches it checks."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from played_nccl_jobs import (
    a_pair_and_a_bystander,
    crossed_communicators,
    one_work_per_batch,
    sends_to_a_peer_gone,
    timed_wait_times_out,
    waits_on_a_dead_peers_future,
)

from autotune.comm.launch import launch, run_local
from autotune.testing import played_nccl

pytestmark = pytest.mark.distributed
ON: dict[str, Any] = {
    "backend": played_nccl.BACKEND,
    "setup": played_nccl.install,
    "timeout_s": 120,
}


def test_a_coalesced_batch_returns_one_work_that_stands_for_each_operation() -> None:
    got = run_local(one_work_per_batch, 2, **ON)
    assert [g["works"] for g in got] == [1, 1]
    assert got[0]["got"] == [[1.0] * 3, [11.0] * 5] and got[1]["got"] == [[0.0] * 3, [10.0] * 5]
    # One launch for the whole batch: its sends and receives, by peer and bytes.
    assert got[0]["launch"] == ("p2p", ((1, 12), (1, 20)), ((1, 12), (1, 20)))


#: The watchdog's wait before it ends a process, 10 s here (4 x 2.5 s; a minute by default).
QUICK_WATCHDOG = {played_nccl.DUMP_WAIT_ENV: "2500"}


def test_a_timed_wait_blocks_the_host_then_aborts_and_the_watchdog_ends_the_process() -> None:
    rank0, rank1 = launch(timed_wait_times_out, 2, env=QUICK_WATCHDOG, **ON)
    assert rank0.ok and rank1.ok, (rank0.error, rank1.error)
    seen = rank0.value
    assert seen["said"].startswith("DistBackendError: [played NCCL] all_reduce of 16 bytes")
    assert "milliseconds before timing out (wait timeout 0:00:00.500000)" in seen["said"]
    assert seen["pending"]  # it gave up at its timeout, while the peer had not come
    # The work keeps its exception; the communicator was aborted: nothing more runs on it.
    assert seen["again"] == seen["said"].removeprefix("DistBackendError: ")
    assert "was aborted on rank 0 (a timed wait ran out)" in seen["launch"]
    # Its result kept, the rank ended as NCCL's watchdog ends it: SIGABRT, not its own exit.
    assert seen["ends_at"] is not None and rank0.exitcode == -signal.SIGABRT
    # The peer came late to a communicator rank 0 had aborted: on a GPU its kernel never ends.
    assert "whose communicator rank 0 aborted" in rank1.value["said"], rank1.value
    assert "(wait timeout 0:00:02)" in rank1.value["said"] and rank1.exitcode == -signal.SIGABRT


def test_the_watchdog_knows_of_a_failure_before_a_waiter_on_its_future() -> None:
    # DDP's reducer waits on a work's future; a waiter woken beside the done-callback that told
    # the watchdog reached destroy_process_group first and exited 0 (a fresh clone's run):
    # NCCL's watchdog watches every work from its launch.
    rank0, _ = launch(waits_on_a_dead_peers_future, 2, env=QUICK_WATCHDOG, **ON)
    assert rank0.ok and rank0.value is not None, (rank0.error, rank0.value)
    assert rank0.exitcode == -signal.SIGABRT


def test_a_send_to_a_dead_peer_launches_then_fails_and_the_watchdog_ends_the_process() -> None:
    # gloo fails a send at once where it has seen the peer's connection close, and whether it
    # has is a race; NCCL launches whatever became of the peer, and the operation fails. A
    # survivor that raised at launch lived on (exit 0), where on a GPU the watchdog ends it.
    rank0, rank1 = launch(sends_to_a_peer_gone, 2, env={played_nccl.DUMP_WAIT_ENV: "500"}, **ON)
    assert rank0.ok, rank0.error
    said = rank0.value
    assert said["launch raised"] is None, said
    assert "Connection closed by peer" in said["wait raised"], said
    assert said["ends_at"] is not None, said
    assert (rank0.exitcode, rank1.exitcode) == (-signal.SIGABRT, 0)


@pytest.mark.parametrize("mode", ["0", "2"])
def test_no_watchdog_teardown_where_error_handling_says_so(mode: str) -> None:
    env = {**QUICK_WATCHDOG, played_nccl.ERROR_HANDLING_ENV: mode}
    rank0, rank1 = launch(timed_wait_times_out, 2, env=env, **ON)
    assert rank0.ok and rank0.value["said"] and rank0.value["ends_at"] is None
    assert (rank0.exitcode, rank1.exitcode) == (0, 0)


def test_launches_in_different_orders_fail_the_job_with_both_sequences() -> None:
    results = launch(crossed_communicators, 2, **ON)
    for r in results:
        assert not r.ok and "OrderError" in (r.error or "")
        error = r.error or ""
        assert "ranks 0 and 1" in error or "ranks 1 and 0" in error
    report = results[0].error or ""
    # Each rank's first launch, on its own communicator: the one each waits for on a GPU.
    assert "rank 0:\n    #0 all_reduce 8 B on group" in report
    assert "rank 1:\n    #0 all_reduce 8 B on group" in report


def test_point_to_point_between_two_ranks_is_not_held_against_a_third() -> None:
    got = run_local(a_pair_and_a_bystander, 3, **ON)
    assert got == [[("p2p", 1), ("all_reduce", 0)]] * 2 + [[("all_reduce", 0)]]
