"""What the engine tells its listeners, in the order it happens on its finishing thread.

One stream for every consumer (the recorder, the metrics, the tuner): per message a
`MessageRecord`; at an iteration's end `IterationEnd` (the same point of the bucket sequence on
every rank; where `Engine.switch_at` announced a plan switch, before the next iteration's first
message starts), then its `IterationRecord`, then `IterationDone` (after the futures: backward is
free to end); once, `Failure`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.ddp.stats import IterationRecord, MessageRecord

__all__ = ["Event", "Failure", "IterationDone", "IterationEnd", "Listener"]


@dataclass(frozen=True, slots=True)
class IterationEnd:
    """Every message of ``iteration`` completed. Where `Engine.switch_at` announced it, the next
    iteration's first message waits for the listeners, so a plan switched here applies from the
    next iteration on every rank (elsewhere the next iteration does not wait). The
    futures of buckets the backend completes itself (`native`, one bucket per message) may have
    completed; the others complete after it. A listener may use the tuner's process group here
    (every rank is at this point); what it takes beyond the next forward delays the step."""

    iteration: int
    exposed_s: float  # from backward's last bucket to its last message done
    #: The step of iteration ``step_of``, from the end of the one before it (None: none known
    #: yet). On the host's clock ``step_of`` is ``iteration``; on CUDA it is the GPU's step of an
    #: iteration `autotune.ddp.step_clock.LAG` back (the same one on every rank).
    step_s: float | None = None
    step_of: int | None = None


@dataclass(frozen=True, slots=True)
class IterationDone:
    """``iteration``'s futures completed. A listener runs alongside the next iteration's
    messages, so it must not use their process group."""

    iteration: int


@dataclass(frozen=True, slots=True)
class Failure:
    """The error that stopped the engine (as diagnosed: every later bucket fails with it)."""

    error: BaseException


Event = MessageRecord | IterationRecord | IterationEnd | IterationDone | Failure
Listener = Callable[[Event], None]
