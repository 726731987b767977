"""The training step on the device's own clock: what a paired test compares.

On the CPU the host does the work, and a step is the host's time from one iteration's end to the
next. On CUDA the host runs ahead of the GPU: the time between two iteration ends on the host is
when Python got there, not what the GPU took, and a paired test on it pairs the wrong
iterations. There a step is the GPU's: a CUDA event is recorded on the stream where an
iteration's last message completes, and the time between two consecutive events is read `LAG`
iterations later, when the GPU has long passed them, so the step never waits for the GPU. (Only
where the GPU is more than `LAG` iterations behind does reading it wait, for the GPU to catch up
to an event `LAG` iterations old.) Every rank reads the step of the same iteration at the same
iteration end, so the MAX over ranks combines the same iteration's steps.

Example::

    >>> clock = StepClock(device_event(torch.device("cuda", 0)))
    >>> clock.end(iteration, time.perf_counter(), stream)  # (iteration - LAG, its step) or None
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

__all__ = ["LAG", "DeviceEvent", "StepClock", "device_event"]

#: Iterations between a CUDA iteration's end and the reading of its step.
LAG = 2


class DeviceEvent(Protocol):
    """What the clock uses of `torch.cuda.Event` (stand-ins in tests)."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds


def device_event(device: torch.device) -> Callable[[], DeviceEvent] | None:
    """What makes a timing event on ``device``: a CUDA event for a CUDA device; None (the
    host's clock) elsewhere."""
    if device.type == "cuda":
        return lambda: torch.cuda.Event(enable_timing=True)
    return None


class StepClock:
    """Steps of consecutive iterations: on the host's clock (``event`` None, lag 0), or between
    device events made by ``event`` and read `LAG` iterations late."""

    def __init__(self, event: Callable[[], DeviceEvent] | None = None, lag: int = LAG) -> None:
        self.event = event
        self.lag = lag if event is not None else 0
        self._last_host: float | None = None
        self._marks: deque[tuple[int, DeviceEvent]] = deque()
        #: Readings that had to wait for the GPU (it was more than `lag` iterations behind).
        self.waited = 0

    @property
    def on_device(self) -> bool:
        return self.event is not None

    def forget(self) -> None:
        """The next iteration's step is not timed: iterations ran outside the hook since the
        last end (`autotune.tuning.plain_check`). Steps not read yet are dropped."""
        self._last_host = None
        self._marks.clear()

    def end(
        self, iteration: int, host_s: float, stream: Any = None, mark: DeviceEvent | None = None
    ) -> tuple[int, float] | None:
        """``iteration`` ended, on the host at ``host_s`` (``time.perf_counter()``); on CUDA at
        ``mark``, an event recorded where its last message ended on the GPU, before anything
        waited for it (else one recorded now on ``stream``). Returns (an iteration, its step in
        seconds) where one is known now: this one on the host's clock, the one `lag`
        iterations back on the GPU's; None for the first (nothing to time it from)."""
        if self.event is None:
            last, self._last_host = self._last_host, host_s
            return None if last is None else (iteration, host_s - last)
        if mark is None:
            mark = self.event()
            mark.record(stream)
        self._marks.append((iteration, mark))
        if len(self._marks) < self.lag + 2:
            return None
        (_, start), (timed, stop) = self._marks[0], self._marks[1]
        self._marks.popleft()
        if not stop.query():
            self.waited += 1
            stop.synchronize()
        return timed, start.elapsed_time(stop) / 1000.0
