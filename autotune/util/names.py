"""A name the user got wrong, said with the nearest right one: "unknown algorithm 'rng' (did you
mean 'ring'?)". One wording for algorithms, settings and models, wherever they are checked."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

__all__ = ["nearest", "typo_of", "unknown"]


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name`` (letters in common, as difflib rates them), if any is
    close enough to be what was meant."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def typo_of(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` is a slip of, if it is one: two edits or fewer away
    (``AUTOTUNE_ALGORITM``, ``AUTOTUNE_NODE_IDS``), or a known name cut short
    (``AUTOTUNE_FUSION`` for ``AUTOTUNE_FUSION_BYTES``). A known name with more after it
    (``AUTOTUNE_STORAGE_DIR``) is another name, not a slip."""
    best: tuple[int, str] | None = None
    for candidate in known:
        if len(name) >= 4 and candidate.startswith(name) and candidate != name:
            return candidate
        distance = _edits(name, candidate)
        if distance <= 2 and (best is None or distance < best[0]):
            best = (distance, candidate)
    return None if best is None else best[1]


def _edits(a: str, b: str) -> int:
    """Levenshtein's distance: insertions, deletions and substitutions from ``a`` to ``b``."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def unknown(kind: str, names: Sequence[str], known: Iterable[str]) -> str:
    """``unknown algorithm 'rng' (did you mean 'ring'?)``; several names, each with its own."""
    known = list(known)
    parts = []
    for name in names:
        near = nearest(name, known)
        parts.append(f"{name!r} (did you mean {near!r}?)" if near else repr(name))
    return f"unknown {kind}{'s' if len(names) > 1 else ''} {', '.join(parts)}"
