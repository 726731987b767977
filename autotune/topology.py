"""Where this rank runs, as the launcher says (torchrun's environment), with one fallback rule."""

from __future__ import annotations

import os

__all__ = ["local_rank"]


def local_rank(default: int = 0) -> int:
    """This process's rank on its node: torchrun's ``LOCAL_RANK``, else ``default`` (a launcher
    that sets no LOCAL_RANK runs one node, where the global rank is the local one)."""
    raw = os.environ.get("LOCAL_RANK")
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"LOCAL_RANK={raw!r} is not a rank (torchrun sets 0, 1, ...)") from None
