"""A GPU and NCCL played on the CPU, for the engine's CUDA paths: what the engine asks of the
GPU (`autotune.ddp.gpu.Gpu`'s methods) is counted, and NCCL's all-reduce behaves as
ProcessGroupNCCL's does: its future is complete at launch, a callback runs with a stream current
that waits for the all-reduce, and waiting on the work (with a timeout, as autotune waits) blocks
the host until the GPU has finished it (here: until the test says so)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from autotune.algorithms import AllReduceAlgorithm, Comm, Pending


class Stream:
    def __init__(self) -> None:
        self.synchronized = 0
        self.waited_events = 0

    def synchronize(self) -> None:
        self.synchronized += 1

    def wait_event(self, event: object) -> None:
        self.waited_events += 1


class Event:
    """Reaches the time (ms) of the stream current where it was recorded."""

    def __init__(self, gpu: PlayedGpu) -> None:
        self.gpu = gpu
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        self.at = self.gpu.stream_at
        self.gpu.recorded.append(threading.current_thread().name)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.gpu.event_waits += 1

    def elapsed_time(self, end: Event) -> float:
        assert self.at is not None and end.at is not None
        return end.at - self.at


class PlayedGpu:
    """Counts what the engine asks of a GPU. ``stream_at``: where (ms) the current stream is."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")  # the tensors stay on the CPU
        self.stream = Stream()
        self.stream_at = 0.0
        self.marks = 0  # buckets marked ready on their producing stream
        self.sides: list[str] = []  # the threads that made the side stream current
        self.recorded: list[str] = []  # the threads that recorded an event
        self.event_waits = 0

    def event(self) -> Event:
        return Event(self)

    def future(self) -> torch.futures.Future[torch.Tensor]:
        return torch.futures.Future()

    def mark(self) -> Event:
        self.marks += 1
        ready = Event(self)
        ready.record()
        return ready

    @contextlib.contextmanager
    def side(self) -> Iterator[Stream]:
        self.sides.append(threading.current_thread().name)
        yield self.stream


class _Done(torch.futures.Future[list[torch.Tensor]]):
    """NCCL's future: complete at launch; a callback runs with a stream current that reaches
    the all-reduce's end (``ends_at``)."""

    def __init__(self, gpu: PlayedGpu, ends_at: float) -> None:
        super().__init__()
        self.gpu, self.ends_at = gpu, ends_at

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        saved, self.gpu.stream_at = self.gpu.stream_at, self.ends_at
        try:
            callback(self)
        finally:
            self.gpu.stream_at = saved


class PlayedNccl(AllReduceAlgorithm):
    """An all-reduce a backend runs on the played GPU; each takes ``took_ms`` of the given list
    in turn, on a group of ``size`` ranks. Every work is held unfinished until `finish` (the
    GPU has done it)."""

    asynchronous = True

    def __init__(self, gpu: PlayedGpu, took_ms: list[float], size: int = 2) -> None:
        super().__init__()
        self.name = "a"  # type: ignore[misc]
        self.gpu, self.took_ms, self.size = gpu, took_ms, size
        self.launched: list[str] = []  # the threads that launched
        self.finished = threading.Event()

    def connect(self, group, device, *, dedicated=True):  # type: ignore[no-untyped-def]
        return SimpleNamespace(size=self.size, backend="nccl", traffic=None)

    def launch(self, buf: torch.Tensor, comm: Any) -> Pending:
        if comm.size == 1:
            return Pending()
        took = self.took_ms[len(self.launched) % len(self.took_ms)]
        self.launched.append(threading.current_thread().name)
        future = _Done(self.gpu, self.gpu.stream_at + took)
        future.set_result([buf])

        def wait() -> None:  # work.wait(timeout) on NCCL: the host waits for the GPU
            assert self.finished.wait(30), "the played GPU never finished"

        return Pending(wait, future=future)

    def _start(self, buf: torch.Tensor, comm: Any, segment_elems: int) -> Pending:
        return self.launch(buf, comm)

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        raise AssertionError("launch is overridden")

    def finish(self) -> None:
        """The GPU has run every all-reduce launched (and any launched later)."""
        self.finished.set()
