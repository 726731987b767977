"""The played NCCL's own rules (autotune.testing.played_nccl), each as NCCL has it: a coalesced
batch's one Work, the host blocked by a timed wait, and the one order of launches it checks."""

from __future__ import annotations

from typing import Any

import pytest
from played_nccl_jobs import (
    a_pair_and_a_bystander,
    crossed_communicators,
    one_work_per_batch,
    timed_wait_times_out,
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


def test_a_timed_wait_blocks_the_host_then_raises_as_nccls_does() -> None:
    (said, pending), (peer_said, _) = run_local(timed_wait_times_out, 2, **ON)
    assert said.startswith("DistBackendError: [played NCCL] all_reduce of 16 bytes")
    assert "milliseconds before timing out (wait timeout 0:00:00.500000)" in said
    assert pending  # it gave up at its timeout, while the peer had not come
    assert peer_said == ""


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
