"""What runs: message-size classes, the `Choice` (algorithm and segment) for each, an `Arm` (a
whole plan: a choice per class and a fusion size), and the `Plan` the engine reads per bucket.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autotune.algorithms import Choice

__all__ = [
    "BASELINE_CHOICE",
    "MIN_FUSION_BYTES",
    "MIN_SEGMENT_BYTES",
    "Arm",
    "Choice",
    "Plan",
    "Rule",
    "check_fusion_bytes",
    "check_segment_bytes",
    "size_class",
]

#: The smallest fusion size (bytes) that is not 0 (off). Below a page, every bucket becomes
#: thousands of latency-bound messages: a 3-byte fusion size once made a step take 78 s.
MIN_FUSION_BYTES = 4096


def check_fusion_bytes(value: object, where: str) -> None:
    """Raise if ``value`` is no fusion size: None, 0 (off), or at least `MIN_FUSION_BYTES`.

    ``where`` names the source for the message (``Config.fusion_bytes``, a plan file, ...).
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: expected an int (bytes), got {value!r}")
    if value < 0 or 0 < value < MIN_FUSION_BYTES:
        raise ValueError(
            f"{where}: must be 0 (DDP's buckets as they are) or at least {MIN_FUSION_BYTES} "
            f"bytes, got {value}"
        )


#: The smallest pipeline segment (bytes) a job may ask for (Config, ``AUTOTUNE_SEGMENT_BYTES``, a
#: plan file). Every segment is a round of messages with its own latency: a 3-byte segment (one
#: element per round) kept an 11k-parameter model's first step from finishing in 45 s. The
#: algorithms themselves take any segment > 0 (their conformance kit tries odd small ones).
MIN_SEGMENT_BYTES = 4096


def check_segment_bytes(value: object, where: str) -> None:
    """Raise if ``value`` is no segment a job may run: None (the algorithm's own) or at least
    `MIN_SEGMENT_BYTES`. ``where`` names the source for the message."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: expected an int (bytes), got {value!r}")
    if value < MIN_SEGMENT_BYTES:
        raise ValueError(
            f"{where}: must be at least {MIN_SEGMENT_BYTES} bytes (each segment is a round of "
            f"messages with its own latency: smaller ones make a step crawl), got {value}"
        )


def size_class(nbytes: int) -> int:
    """The power of two a message of ``nbytes`` belongs to: class c holds sizes in (c/2, c]."""
    if nbytes < 0:
        raise ValueError(f"message size must be >= 0, got {nbytes}")
    return 1 << max(nbytes - 1, 0).bit_length()


#: What every size class runs in the baseline (the job without autotune), and wherever a plan
#: says nothing.
BASELINE_CHOICE = Choice("native")


@dataclass(frozen=True)
class Arm:
    """A whole plan: the choices that differ from `BASELINE_CHOICE`, and the fusion size."""

    choices: tuple[tuple[int, Choice], ...] = ()
    fusion_bytes: int = 0

    @staticmethod
    def of(choices: Mapping[int, Choice], fusion_bytes: int) -> Arm:
        kept = sorted((cls, c) for cls, c in choices.items() if c != BASELINE_CHOICE)
        return Arm(tuple(kept), fusion_bytes)

    def as_dict(self) -> dict[int, Choice]:
        return dict(self.choices)

    def choice(self, cls: int) -> Choice:
        return self.as_dict().get(cls, BASELINE_CHOICE)

    def with_class(self, cls: int, choice: Choice) -> Arm:
        return Arm.of({**self.as_dict(), cls: choice}, self.fusion_bytes)

    def with_fusion(self, fusion_bytes: int) -> Arm:
        return Arm(self.choices, fusion_bytes)

    def describe(self) -> str:
        from autotune.util.units import format_bytes

        parts = [f"{format_bytes(cls)}: {c}" for cls, c in self.choices]
        fusion = f"fusion {format_bytes(self.fusion_bytes)}" if self.fusion_bytes else ""
        return ", ".join([*parts, *([fusion] if fusion else [])]) or "native"


#: Picks the choice for a size class.
Rule = Callable[[int], Choice]


class Plan:
    """Per size class, what to run: explicit choices over a default rule. Safe across threads."""

    def __init__(self, default: Rule | Choice | None = None) -> None:
        self._default: Rule | None = None
        self._fixed: Choice | None = None  # the default, where it is one choice, not a rule
        self._chosen: dict[int, Choice] = {}
        self._seen: set[int] = set()
        self._lock = threading.Lock()
        if default is not None:
            self.set_default(default)

    def set_default(self, default: Rule | Choice) -> None:
        """The choice for size classes without an explicit one: a fixed choice, or a rule."""
        if isinstance(default, Choice):
            fixed = self._fixed = default
            self._default = lambda nbytes: fixed
        else:
            self._fixed, self._default = None, default

    def _fallback(self, cls: int) -> Choice:
        assert self._default is not None, "the plan has no default rule yet"
        return self._default(cls)

    def choice(self, nbytes: int) -> Choice:
        """What runs a message of ``nbytes`` (and note that its class occurs in this job)."""
        cls = size_class(nbytes)
        with self._lock:
            self._seen.add(cls)
            chosen = self._chosen.get(cls)
        return chosen if chosen is not None else self._fallback(cls)

    def set(self, cls: int, choice: Choice) -> None:
        """Run ``choice`` for every message of size class ``cls`` from now on."""
        if cls != size_class(cls):
            raise ValueError(f"size classes are powers of two, got {cls}")
        with self._lock:
            self._chosen[cls] = choice

    def replace(self, chosen: dict[int, Choice]) -> None:
        """Run exactly ``chosen`` (size class -> choice) from now on, the default elsewhere."""
        with self._lock:
            self._chosen = dict(chosen)

    def choices(self) -> list[Choice] | None:
        """Every choice the plan can make now (the explicit ones and the default); None where a
        rule picks the default, which may pick anything."""
        if self._fixed is None:
            return None
        with self._lock:
            return [self._fixed, *self._chosen.values()]

    def table(self) -> dict[int, Choice]:
        """The choice for every size class seen so far, smallest first."""
        with self._lock:
            seen = sorted(self._seen)
            chosen = dict(self._chosen)
        return {cls: chosen.get(cls) or self._fallback(cls) for cls in seen}
