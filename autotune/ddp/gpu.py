"""The CUDA calls the engine makes for the job's device, in one place.

A bucket's gradient is ready when the stream that produced it gets there: `Gpu.mark` records an
event there, for a message that starts on another stream to wait for. Messages that autotune
drives start on one side stream per device (`Gpu.side`); futures carry the device, so a result
completes on the streams current where it is set (`Gpu.future`); `Gpu.event` makes a timing
event. `Gpu.of` is None off CUDA. Tests play a GPU on the CPU through a stand-in with the same
methods, counting what the engine asks of it (tests/ddp/test_nccl_lane.py).

Example::

    >>> gpu = Gpu.of(torch.device("cuda", 0))
    >>> ready = gpu.mark()  # on the producing stream
    >>> with gpu.side() as stream:
    ...     stream.wait_event(ready)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from autotune.ddp.step_clock import DeviceEvent, device_event

__all__ = ["Gpu", "side"]


class Gpu:
    """A CUDA device's streams, events and futures, as the engine uses them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        event = device_event(device)
        assert event is not None, f"{device} is not a CUDA device"
        #: Makes a timing event (CUDA's ``enable_timing``).
        self.event = event
        self._stream: torch.cuda.Stream | None = None
        # Its own lock: the submitting thread starts a message inline with the engine's lock
        # held, and that lock is not reentrant. (Taking it here hung the first DDP step on CUDA,
        # seen on an H200.)
        self._lock = threading.Lock()

    @classmethod
    def of(cls, device: torch.device) -> Gpu | None:
        """The device's GPU where it is a CUDA device; None elsewhere."""
        return cls(device) if device.type == "cuda" else None

    def future(self) -> torch.futures.Future[torch.Tensor]:
        """A future whose result, once set, is ready on the streams current where it was set."""
        return torch.futures.Future(devices=[self.device])

    def mark(self) -> DeviceEvent:
        """An event recorded now on the device's current stream (where the gradient is made)."""
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        return ready

    @contextlib.contextmanager
    def side(self) -> Iterator[Any]:
        """Make the device's side stream current (made once, kept), and yield it."""
        with self._lock:
            if self._stream is None:
                self._stream = torch.cuda.Stream(self.device)
            stream = self._stream
        with torch.cuda.stream(stream):
            yield stream


def side(gpu: Gpu | None) -> contextlib.AbstractContextManager[Any]:
    """``gpu``'s side stream made current (entered, it gives the stream, `Gpu.side`); None off
    CUDA (``gpu`` None). The engine enters it for every message, on both its threads."""
    return _NO_STREAM if gpu is None else gpu.side()


_NO_STREAM = contextlib.nullcontext()
