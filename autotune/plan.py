"""Message-size classes, the choice made for each, and the plan that maps one to the other."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Choice", "Plan", "default_choice", "size_class"]


def size_class(nbytes: int) -> int:
    """The power of two a message of ``nbytes`` belongs to: class c holds sizes in (c/2, c]."""
    if nbytes < 0:
        raise ValueError(f"message size must be >= 0, got {nbytes}")
    return 1 << max(nbytes - 1, 0).bit_length()


@dataclass(frozen=True)
class Choice:
    """What runs a message: an algorithm, and its pipeline segment (None: the algorithm's own)."""

    algorithm: str
    segment_bytes: int | None = None


#: Picks the choice for a size class.
Rule = Callable[[int], Choice]

#: Up to this message size, "auto" without a tuner picks `tree` on gloo.
DEFAULT_TREE_MAX_BYTES = 1 << 20


def default_choice(backend: str, candidates: tuple[str, ...]) -> Rule:
    """The plan "auto" follows until the tuner has measured something (docs/BENCHMARKS.md).

    On gloo, `tree` for messages up to 1 MiB: a handful of hops instead of the ring's 2(N-1)
    dependent steps, which measured 1.3-3x faster than native at 4 ranks; above that, `native`,
    which no point-to-point algorithm beat at 16 MiB. On NCCL and any other backend, `native`:
    NCCL tunes its own ring and tree, and a Python-driven P2P schedule is not measured there yet.
    A choice outside ``candidates`` falls back to the first candidate.
    """

    def pick(name: str) -> str:
        return name if name in candidates else candidates[0]

    small = pick("tree" if backend == "gloo" else "native")
    large = pick("native")

    def choose(nbytes: int) -> Choice:
        return Choice(small if nbytes <= DEFAULT_TREE_MAX_BYTES else large)

    return choose


class Plan:
    """Per size class, what to run: explicit choices over a default rule. Safe across threads."""

    def __init__(self, default: Rule | Choice | None = None) -> None:
        self._default: Rule | None = None
        self._chosen: dict[int, Choice] = {}
        self._seen: set[int] = set()
        self._lock = threading.Lock()
        if default is not None:
            self.set_default(default)

    @property
    def has_default(self) -> bool:
        return self._default is not None

    def set_default(self, default: Rule | Choice) -> None:
        """The choice for size classes without an explicit one: a fixed choice, or a rule."""
        if isinstance(default, Choice):
            fixed = default
            self._default = lambda nbytes: fixed
        else:
            self._default = default

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

    def table(self) -> dict[int, Choice]:
        """The choice for every size class seen so far, smallest first."""
        with self._lock:
            seen = sorted(self._seen)
            chosen = dict(self._chosen)
        return {cls: chosen.get(cls) or self._fallback(cls) for cls in seen}
