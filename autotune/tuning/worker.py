"""The thread that runs Optuna's calls on rank 0, so storage I/O never blocks a training step."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["Worker"]


class Worker:
    """Runs Optuna's calls on rank 0, one at a time, off the training's critical path; between
    them, every ``tick_s``, ``tick`` (the heartbeat of the job's running trials)."""

    def __init__(self, tick: Callable[[], None] = lambda: None, tick_s: float = 5.0) -> None:
        self._tick, self._tick_s = tick, tick_s
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="autotune-optuna", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def close(self, timeout_s: float) -> None:
        self._jobs.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._tick_s)
            except queue.Empty:
                job = self._tick
            if job is None:
                return
            if self.error is not None:
                continue
            try:
                job()
                if job is not self._tick:  # busy: beat between jobs too (the store rate-limits)
                    self._tick()
            except BaseException as exc:  # reported on the finish thread, at the next exchange
                self.error = exc
