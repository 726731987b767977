"""A name the user got wrong, said with the nearest right one: "unknown algorithm 'rng' (did you
mean 'ring'?)". One wording for algorithms, settings and models, wherever they are checked."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

__all__ = ["nearest", "unknown"]


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name`` (letters in common, as difflib rates them), if any is
    close enough to be what was meant."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown(kind: str, names: Sequence[str], known: Iterable[str]) -> str:
    """``unknown algorithm 'rng' (did you mean 'ring'?)``; several names, each with its own."""
    known = list(known)
    parts = []
    for name in names:
        near = nearest(name, known)
        parts.append(f"{name!r} (did you mean {near!r}?)" if near else repr(name))
    return f"unknown {kind}{'s' if len(names) > 1 else ''} {', '.join(parts)}"
