"""How far an engine's iterations got on each of its threads, and what waits for that.

The submitting thread counts the iterations whose last bucket it handed over; the completing
thread those whose `IterationEnd` and `IterationDone` listeners have run. An iteration's first
bucket waits for the completing thread where the plan may switch (`Progress.wait_for_plan`), and
`Progress.settle` waits for it to catch up; a failure releases every wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Progress"]


class Progress:
    """Iterations submitted, ended and done, and where the plan may switch."""

    def __init__(self) -> None:
        self.submitted = 0
        self._open = False  # an iteration's buckets are being submitted
        self._ended = 0
        self._done = 0
        self._switches: set[int] = set()  # iterations at whose end the plan may change
        self._failed = False
        self._condition = threading.Condition(threading.Lock())

    def bucket(self) -> None:
        """A bucket is about to be handed over (the submitting thread): the first of its
        iteration waits for its plan (`wait_for_plan`)."""
        if not self._open:
            self._open = True
            self.wait_for_plan(self.submitted + 1)

    def submitted_one(self) -> None:
        """An iteration's last bucket was handed over (the submitting thread)."""
        self._open = False
        with self._condition:
            self.submitted += 1

    def ended_one(self) -> None:
        """An iteration's `IterationEnd` listeners have run (the completing thread)."""
        with self._condition:
            self._ended += 1
            self._condition.notify_all()

    def done_one(self) -> None:
        """An iteration's `IterationDone` listeners have run (the completing thread)."""
        with self._condition:
            self._done += 1
            self._condition.notify_all()

    def fail(self) -> None:
        """The engine failed: nothing waits for its threads any more."""
        with self._condition:
            self._failed = True
            self._condition.notify_all()

    def switch_at(self, iteration: int) -> None:
        """The plan may change at the end of ``iteration`` (`Engine.switch_at`)."""
        with self._condition:
            self._switches.add(iteration)

    def wait_for_plan(self, iteration: int) -> None:
        """Before ``iteration``'s first bucket: make sure it runs the plan every rank runs.

        The completing thread is always let get two iterations behind (it has handled the
        `IterationDone` that would have announced a switch); it must have handled the previous
        iteration's end only where the plan may switch there. Waiting at every iteration would
        tie each step to that thread's scheduling (milliseconds on an oversubscribed CPU).
        """
        previous = iteration - 1

        def ready() -> bool:
            if self._done < iteration - 2:
                return False
            return previous not in self._switches or self._ended >= previous

        self._wait_for(ready)
        with self._condition:
            self._switches.discard(previous)

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted iteration is done on the completing thread: True, or
        False at the timeout. A failure settles it too."""
        return self._wait_for(lambda: self._done >= self.submitted, timeout_s)

    def _wait_for(self, progress: Callable[[], bool], timeout_s: float | None = None) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: progress() or self._failed, timeout_s)
