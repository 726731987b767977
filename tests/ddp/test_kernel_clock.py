"""A CUDA message NCCL runs is timed by NCCL's own clock where its profiler is loaded: the engine
takes a ticket per message at launch, completes the buckets' futures without synchronizing a
stream, then emits each message's record with the kernel time of the profiler record matched to
it. Played on CPU: a played GPU (tests/support/played_gpu.py, counting stream synchronizations)
and a stand-in profiler."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from played_gpu import PlayedGpu, Stream
from test_engine import Backend

from autotune.comm.nccl_feed import NcclFeed
from autotune.ddp.engine import Engine
from autotune.ddp.kernel_clock import AUTOTUNE, GIVE_UP, LANE, KernelClock, Ticket
from autotune.ddp.stats import Recorder
from autotune.plan import Choice, Plan

COMM = 0xC0


def record(nbytes: int, kernel_ns: int, comm_id: int = COMM, nranks: int = 2,
           func: str = "AllReduce") -> SimpleNamespace:  # fmt: skip
    """What autotune_nccl.Profiler.drain gives, as far as the clock reads it."""
    return SimpleNamespace(func=func, nbytes=nbytes, kernel_ns=kernel_ns, comm_id=comm_id,
                           nranks=nranks)  # fmt: skip


class Profiler:
    """The profiler's ring: the test puts records in, the feed drains them."""

    def __init__(self) -> None:
        self.ring: list[SimpleNamespace] = []
        self.lock = threading.Lock()

    def put(self, *records: SimpleNamespace) -> None:
        with self.lock:
            self.ring.extend(records)

    def drain(self) -> list[Any]:
        with self.lock:
            out, self.ring = self.ring, []
        return out

    def stats(self) -> Any:
        return None

    def predictions(self) -> list[Any]:
        return []

    def mark_served(self, port: int) -> None:

        pass


class Nccl(Backend):
    """An all-reduce NCCL runs: launched, and completed when the test says NCCL finished."""

    def connect(self, group, device, *, dedicated=True):  # type: ignore[no-untyped-def]
        return SimpleNamespace(size=2, backend="nccl", traffic=None)

    def _start(self, buf: torch.Tensor, comm: Any, segment_elems: int) -> Any:
        return self.launch(buf, comm)


@pytest.fixture
def played() -> Iterator[tuple[Profiler, NcclFeed]]:
    profiler = Profiler()
    feed = NcclFeed(profiler, interval_s=0.01)
    yield profiler, feed
    feed.close()


def one_bucket(clock: KernelClock | None) -> tuple[Engine, Recorder, Stream]:
    """A 64-byte bucket sent as two 32-byte messages on NCCL, from an engine whose messages start
    on a stand-in side stream (as on CUDA); NCCL has finished both when this returns, and the
    bucket's future has completed."""
    gpu, algo = PlayedGpu(), Nccl("a", [])
    stream = gpu.stream
    engine = on_cuda(algo, clock, gpu)
    recorder = Recorder()
    engine.subscribe(recorder.record)
    future = engine.submit(torch.ones(16), is_last=True)
    for f in algo.futures:
        f.set_result([])
    future.wait()
    return engine, recorder, stream


def on_cuda(algo: Nccl, clock: KernelClock | None, gpu: PlayedGpu) -> Engine:
    """An engine of 2 ranks running ``algo`` on the played ``gpu`` (as on CUDA), cutting a
    64-byte bucket into two 32-byte messages."""
    return Engine(
        group=None,  # type: ignore[arg-type]
        world_size=2,
        plan=Plan(Choice("a")),
        algorithm_for=lambda name: algo,
        fusion_bytes=32,
        clock=clock,
        gpu=gpu,  # type: ignore[arg-type]
    )


def test_nccl_messages_carry_its_kernel_time_beside_the_gpus_and_no_stream_is_synchronized(
    played: tuple[Profiler, NcclFeed],
) -> None:
    profiler, feed = played
    clock = KernelClock(feed, world_size=2)
    # The bucket completes before NCCL's records are in: nothing waits for them.
    engine, recorder, stream = one_bucket(clock)
    assert recorder.records() == []
    # Another group's all-reduce of the same size, one of the user's of another size, then ours.
    profiler.put(record(32, 1_000, comm_id=0xD0, nranks=4), record(64, 9_000_000))
    profiler.put(record(32, 3_000_000), record(32, 5_000_000))
    assert engine.settle(10)
    # One clock for every message on a GPU (CUDA events), NCCL's kernel time beside it.
    got = [(r.nbytes, r.timer, r.kernel_s) for r in recorder.records()]
    assert got == [(32, "cuda", 0.003), (32, "cuda", 0.005)]
    assert stream.synchronized == 0
    assert (clock.matched, clock.missed, clock.comm_ids) == (2, 0, {AUTOTUNE: COMM})
    engine.close()
    clock.close()


def test_without_a_record_in_time_a_message_has_no_kernel_time_and_the_same_clock(
    played: tuple[Profiler, NcclFeed],
) -> None:
    profiler, feed = played
    clock = KernelClock(feed, world_size=2, wait_s=0.05)
    engine, recorder, stream = one_bucket(clock)
    assert engine.settle(10)
    assert [(r.timer, r.kernel_s) for r in recorder.records()] == [("cuda", None)] * 2
    assert stream.synchronized == 0 and clock.missed == 2
    # A record that comes late matches no withdrawn ticket.
    profiler.put(record(32, 1_000))
    feed.poll()
    assert clock.matched == 0
    engine.close()
    clock.close()


def test_without_a_clock_every_cuda_message_is_timed_on_the_gpu_no_stream_synchronized() -> None:
    engine, recorder, stream = one_bucket(None)
    assert engine.settle(10)
    assert [(r.timer, r.kernel_s) for r in recorder.records()] == [("cuda", None)] * 2
    assert stream.synchronized == 0
    engine.close()


def tickets(clock: KernelClock, *sizes: int, route: str = LANE) -> list[Ticket]:
    out = [clock.expect(n, route) for n in sizes]
    assert all(t is not None for t in out)
    return out  # type: ignore[return-value]


def test_tickets_match_in_launch_order_by_size(played: tuple[Profiler, NcclFeed]) -> None:
    profiler, feed = played
    clock = KernelClock(feed, world_size=2)
    small, large, small2 = tickets(clock, 32, 64, 32)
    profiler.put(record(64, 7_000), record(32, 1_000), record(32, 2_000))
    profiler.put(record(32, 5, func="AllGather"), record(32, 0))  # not all-reduces, or untimed
    assert clock.seconds(large) == 7e-6
    assert clock.seconds(small) == 1e-6 and clock.seconds(small2) == 2e-6
    clock.close()


def test_the_lane_and_autotunes_group_each_match_their_own_communicator(
    played: tuple[Profiler, NcclFeed],
) -> None:
    # The lane runs on the job's communicator, autotune's own messages on its group's: the
    # clock pinned itself to the first and made the other's tickets wait out their time, each.
    profiler, feed = played
    clock = KernelClock(feed, world_size=2, wait_s=2.0)
    [lane] = tickets(clock, 32)
    profiler.put(record(32, 1_000, comm_id=0xA1))
    assert clock.seconds(lane) == 1e-6
    [ours, ours2] = tickets(clock, 32, 32, route=AUTOTUNE)
    [lane2] = tickets(clock, 32)
    # The job's communicator's next record goes to the lane, the other's to autotune's route.
    profiler.put(record(32, 2_000, comm_id=0xB2), record(32, 3_000, comm_id=0xA1))
    profiler.put(record(32, 4_000, comm_id=0xB2))
    assert (clock.seconds(ours), clock.seconds(ours2), clock.seconds(lane2)) == (2e-6, 4e-6, 3e-6)
    assert clock.comm_ids == {LANE: 0xA1, AUTOTUNE: 0xB2} and clock.missed == 0
    clock.close()


def test_a_route_no_record_ever_answers_stops_taking_tickets(
    played: tuple[Profiler, NcclFeed],
) -> None:
    # As NCCL's one-rank path, or a NCCL that does not call the profiler for a collective:
    # after GIVE_UP misses the route takes no ticket, so no message waits for a record again.
    profiler, feed = played
    clock = KernelClock(feed, world_size=2, wait_s=0.01)
    for _ in range(GIVE_UP):
        [t] = tickets(clock, 32)
        assert clock.seconds(t) is None
    assert clock.expect(32, LANE) is None
    [other] = tickets(clock, 32, route=AUTOTUNE)  # the other route still has its chance
    profiler.put(record(32, 5_000))
    assert clock.seconds(other) == 5e-6
    assert clock.expect(64, AUTOTUNE) is not None
    clock.close()


def test_a_route_that_was_answered_keeps_its_tickets_after_misses(
    played: tuple[Profiler, NcclFeed],
) -> None:
    profiler, feed = played
    clock = KernelClock(feed, world_size=2, wait_s=0.01)
    [t] = tickets(clock, 32)
    profiler.put(record(32, 1_000))
    assert clock.seconds(t) == 1e-6
    for _ in range(GIVE_UP + 1):
        [t] = tickets(clock, 32)
        assert clock.seconds(t) is None  # late records: withdrawn, counted
    assert clock.expect(32, LANE) is not None and clock.missed == GIVE_UP + 1
    clock.close()
