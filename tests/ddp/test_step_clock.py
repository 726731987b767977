"""The step on the device's clock (`autotune.ddp.step_clock`, `autotune.tuning.blocks`), with
stand-ins for CUDA events whose GPU times differ from the host's intervals: on CUDA the host runs
ahead, and a paired test on the host's intervals pairs the wrong iterations."""

from __future__ import annotations

import itertools
import statistics
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from autotune.ddp.step_clock import LAG, StepClock, device_event
from autotune.plan import Arm, Choice
from autotune.tuning.blocks import BLOCK, BLOCK_STEPS, BLOCK_WARMUP, BlockTimer
from autotune.tuning.steps import StepLog, window_step


class Gpu:
    """A GPU timeline: the n-th event recorded completes at ``done_at[n]`` ms, and the GPU has
    reached ``now`` ms (a synchronize waits until the event is done)."""

    def __init__(self, done_at: list[float]) -> None:
        self.done_at = done_at
        self.now = 0.0
        self.recorded = 0
        self.streams: list[Any] = []
        self.synchronized = 0

    def event(self) -> Event:
        return Event(self)


class Event:
    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        self.at = self.gpu.done_at[self.gpu.recorded]
        self.gpu.recorded += 1
        self.gpu.streams.append(stream)

    def query(self) -> bool:
        assert self.at is not None
        return self.gpu.now >= self.at

    def synchronize(self) -> None:
        assert self.at is not None
        self.gpu.synchronized += 1
        self.gpu.now = max(self.gpu.now, self.at)

    def elapsed_time(self, end: Event) -> float:
        assert self.at is not None and end.at is not None
        assert self.query() and end.query(), "elapsed_time on an event the GPU has not reached"
        return end.at - self.at


#: The GPU's ends of iterations 1..8 (ms): steps of 10, 30, 10, 30, ... ms.
GPU_ENDS = [0.0, 10.0, 40.0, 50.0, 80.0, 90.0, 120.0, 130.0]


def test_on_cuda_each_step_is_the_gpus_read_lag_iterations_late() -> None:
    gpu = Gpu(GPU_ENDS)
    clock = StepClock(gpu.event)
    assert clock.on_device and clock.lag == LAG == 2
    got = []
    for i, _ in enumerate(GPU_ENDS, start=1):
        # The host reaches each iteration's end every 1 ms, far ahead of the GPU; the GPU has
        # finished everything up to LAG iterations back.
        gpu.now = GPU_ENDS[max(0, i - 1 - LAG)]
        got.append(clock.end(i, host_s=i * 1e-3, stream=f"s{i}"))
    # Nothing until an iteration LAG back has one before it; then iteration i - LAG's GPU step.
    assert got[: LAG + 1] == [None] * (LAG + 1)
    steps = [(i, round(s, 6)) for i, s in got[LAG + 1 :]]  # type: ignore[misc]
    assert steps == [(2, 0.01), (3, 0.03), (4, 0.01), (5, 0.03), (6, 0.01)]
    assert gpu.streams == [f"s{i}" for i in range(1, 9)]  # recorded where the iteration ended
    assert gpu.synchronized == 0 and clock.waited == 0  # the step never waited for the GPU


def test_a_gpu_more_than_lag_iterations_behind_is_waited_for_and_counted() -> None:
    gpu = Gpu(GPU_ENDS)
    clock = StepClock(gpu.event)
    got = [clock.end(i, host_s=0.0) for i in range(1, 5)]  # the GPU has done nothing yet
    assert got[-1] is not None and got[-1][0] == 2 and got[-1][1] == pytest.approx(0.01)
    assert clock.waited == 1 and gpu.synchronized == 1


def test_forget_drops_what_is_not_read_yet() -> None:
    gpu = Gpu([0.0, 10.0, 500.0, 510.0, 520.0, 530.0])
    gpu.now = 1e9
    clock = StepClock(gpu.event)
    for i in (1, 2):
        clock.end(i, 0.0)
    clock.forget()  # iterations ran without the hook in between (500 ms of them)
    got = [clock.end(i, 0.0) for i in (3, 4, 5, 6)]
    assert got[:3] == [None, None, None]
    assert got[3] is not None
    assert got[3][0] == 4 and got[3][1] == pytest.approx(0.01)  # 510 - 500 ms; never 500 - 10


def test_on_the_host_the_step_is_the_hosts_of_this_iteration() -> None:
    clock = StepClock(device_event(torch.device("cpu")))
    assert not clock.on_device and clock.lag == 0
    assert clock.end(1, 1.0) is None
    assert clock.end(2, 1.25) == (2, 0.25)
    clock.forget()
    assert clock.end(3, 9.0) is None


A, B = Arm(), Arm.of({1 << 20: Choice("ring")}, 0)


def test_a_window_counts_only_the_steps_of_the_plan_its_latest_step_ran() -> None:
    assert window_step([], A) == (A, None)
    # On the host's clock: every step ran the window's plan.
    assert window_step([(B, 0.2), (B, 0.4), (B, 0.3)], B) == (B, 0.3)
    # On CUDA, late: the window runs B now, but its steps are from iterations that ran A, then
    # the first B: the B step is reported for B, the A steps not mixed in.
    assert window_step([(A, 0.1), (A, 0.1), (B, 0.5)], B) == (B, 0.5)
    arm, step = window_step([(A, 0.1), (A, 0.3)], B)
    assert arm == A and step == pytest.approx(0.2)


def test_blocks_on_cuda_time_the_gpus_steps() -> None:
    # The host ticks at once (1 us apart); the GPU's steps alternate 10 and 30 ms.
    ends = [10.0 * i + (20.0 * (i // 2)) for i in range(3 * BLOCK + 1)]
    gpu = Gpu(ends)
    ddp = SimpleNamespace(
        require_backward_grad_sync=True,
        module=torch.nn.Linear(2, 2),
    )
    timer = BlockTimer(ddp, event=gpu.event)  # type: ignore[arg-type]
    timer.most = lambda values: values  # type: ignore[method-assign]  # one rank
    got = [timer.tick() for _ in range(BLOCK + 1)]
    assert got[:BLOCK] == [None] * BLOCK
    steps = [(b - a) / 1000 for a, b in itertools.pairwise(ends[: BLOCK + 1])]
    block = got[BLOCK]
    assert block is not None and block == pytest.approx(statistics.median(steps[BLOCK_WARMUP:]))
    assert block > 0.005  # the GPU's milliseconds, not the host's microseconds
    assert gpu.synchronized == 1  # once a block, where the MAX over ranks waits anyway
    # The next block starts from the last mark: on the same reducer, BLOCK_STEPS forwards, all
    # timed; on a new one (`renewed`), BLOCK_WARMUP untimed first.
    assert [timer.tick() for _ in range(BLOCK_STEPS - 1)] == [None] * (BLOCK_STEPS - 1)
    second = timer.tick()
    steps = [(b - a) / 1000 for a, b in itertools.pairwise(ends[BLOCK : BLOCK + BLOCK_STEPS + 1])]
    assert second is not None and second == pytest.approx(statistics.median(steps))
    timer.renewed()
    assert [timer.tick() for _ in range(BLOCK - 1)] == [None] * (BLOCK - 1)
    assert timer.tick() is not None and timer.iterations == 2 * BLOCK + BLOCK_STEPS + 1


def test_a_paired_schedule_on_the_gpus_clock_pairs_each_step_with_the_plan_that_ran_it() -> None:
    # A paired test's schedule, one-iteration windows: A, B, B, A, A, B, ... The GPU takes 10 ms
    # under A and 30 ms under B; the host reaches every iteration's end 1 ms apart. Each
    # exchange's step must be reported with the plan of the iteration it timed.
    schedule = [A, B, B, A, A, B, A, B, B, A, B, A]
    gpu_ms = {A: 10.0, B: 30.0}
    ends, t = [], 0.0
    for arm in schedule:
        t += gpu_ms[arm]
        ends.append(t)
    gpu = Gpu(ends)
    clock, log = StepClock(gpu.event), StepLog()
    reported = []
    for i, arm in enumerate(schedule, start=1):
        gpu.now = ends[max(0, i - 1 - LAG)]
        timed = clock.end(i, host_s=i * 1e-3)
        step_of, step = (None, None) if timed is None else timed
        log.ended(i, arm, step, step_of)
        reported.append(log.window(arm))  # the window: this iteration, run under ``arm``
        log.clear()
    for (under, step), i in zip(reported[LAG + 1 :], range(2, len(schedule) + 1), strict=False):
        assert under == schedule[i - 1] and step == pytest.approx(gpu_ms[under] / 1000), i
    # On the host's intervals (1 ms each) no plan would differ from another at all.
    assert {round(s, 3) for _, s in reported[LAG + 1 :] if s is not None} == {0.01, 0.03}
