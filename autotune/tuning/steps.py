"""Which plan each timed step ran: the tuner's window of steps (`StepLog`).

A step reaches the tuner with the iteration it belongs to (`autotune.ddp.events.IterationEnd`):
the iteration that just ended on the host's clock, one `autotune.ddp.step_clock.LAG` iterations
back on the GPU's. The log remembers the plan every recent iteration ran (the same on every rank:
every rank switches at the same iteration) and keeps each step with its iteration's plan, so a
paired test is told each step under the plan that really ran it.
"""

from __future__ import annotations

import statistics

from autotune.plan import Arm

__all__ = ["KEPT", "StepLog", "window_step"]

#: Iterations whose plan the log remembers.
KEPT = 16


class StepLog:
    """The steps of the tuner's current window, each with the plan its iteration ran."""

    def __init__(self) -> None:
        self._ran: dict[int, Arm] = {}
        self.steps: list[tuple[Arm, float]] = []

    def ended(self, iteration: int, ran: Arm, step_s: float | None, step_of: int | None) -> None:
        """``iteration`` ended, having run ``ran``; ``step_s`` is ``step_of``'s step (None:
        ``iteration``'s). A step of an iteration the log no longer remembers is dropped."""
        self._ran[iteration] = ran
        self._ran.pop(iteration - KEPT, None)
        of = self._ran.get(iteration if step_of is None else step_of)
        if step_s is not None and of is not None:
            self.steps.append((of, step_s))

    def window(self, window_arm: Arm) -> tuple[Arm, float | None]:
        """The window's step for the exchange (`window_step`)."""
        return window_step(self.steps, window_arm)

    def clear(self) -> None:
        """A new window: its steps go; the plans iterations ran are kept."""
        self.steps.clear()


def window_step(steps: list[tuple[Arm, float]], window_arm: Arm) -> tuple[Arm, float | None]:
    """A window's step for the exchange: the median of its steps that ran the plan of its latest
    one, and that plan (``window_arm`` where the window has none). On the host's clock every
    step of a window ran the window's plan; on CUDA the steps arrive a few iterations late
    (`autotune.ddp.step_clock`), and one that ran the plan before a switch is not counted for
    the plan after it. The same on every rank: each times the same iterations."""
    if not steps:
        return window_arm, None
    arm = steps[-1][0]
    return arm, statistics.median(s for a, s in steps if a == arm)
