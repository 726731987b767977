"""autotune's dedicated groups (`autotune.comm.groups`): a channel per state, and nothing built
on the failure path."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from autotune.algorithms import PeerError, forget_p2p_group, get_algorithm, p2p_group
from autotune.comm.groups import Comm
from autotune.comm.launch import run_local

pytestmark = pytest.mark.distributed


def _groups() -> int:
    return len(dist.distributed_c10d._world.pg_map)


def _channels(rank: int, world_size: int) -> tuple[bool, bool, bool]:
    first, second = p2p_group(None, channel=0), p2p_group(None, channel=1)
    return (
        first is not second,
        p2p_group(None, channel=1) is second,  # made once
        p2p_group(second) is second,  # a dedicated group is its own
    )


def test_each_channel_is_a_group_of_its_own() -> None:
    assert run_local(_channels, 2) == [(True, True, True)] * 2


def _after_a_failure(rank: int, world_size: int) -> tuple[str, int, bool]:
    channel = p2p_group(None, timedelta(seconds=10), channel=3)
    forget_p2p_group(None, 3)  # what a state does once a failure aborted it
    before = _groups()
    try:
        # A message the engine started after the failure, on the channel it aborted.
        get_algorithm("ring", timeout_s=10).all_reduce(torch.ones(4), channel)
        error = "no error"
    except PeerError as exc:
        error = str(exc)
    built = _groups() - before
    fresh = p2p_group(None, timedelta(seconds=10), channel=3)  # asked for afresh: made
    return error, built, fresh is not channel


def test_nothing_is_built_on_the_failure_path() -> None:
    # A survivor once took 10 s instead of 0.1 s for its error: a message started after the
    # failure built a group for the aborted one, waiting on peers that were gone.
    for error, built, fresh in run_local(_after_a_failure, 2):
        assert "ring all-reduce: autotune's group autotune_p2p3:" in error, error
        assert "was aborted after a failure" in error
        assert built == 0 and fresh


def test_a_launch_the_connection_fails_is_the_peers_failure_and_a_bad_argument_is_ours() -> None:
    comm = Comm(None, 0, 2, "gloo", "ring", None)  # type: ignore[arg-type]  # no peer asked
    closed = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:24790."
    )

    def fails(error: Exception) -> Callable[[], None]:
        def launch() -> None:
            raise error

        return launch

    for error in (closed, dist.DistBackendError("NCCL error: remote process exited")):
        with pytest.raises(PeerError, match="ring all-reduce: launching round 0 failed") as got:
            comm.posted(fails(error), "round 0")
        assert got.value.__cause__ is error and got.value.algorithm == "ring"
    bad = RuntimeError("Tensors must be contiguous")
    with pytest.raises(RuntimeError) as raised:
        comm.posted(fails(bad), "round 0")
    assert raised.value is bad  # this rank's own error: the verdict names this rank
    assert comm.posted(lambda: 7, "round 0") == 7
