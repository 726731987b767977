"""What runs a message: the name the algorithms and the plans share (`autotune.plan` re-exports
it), here below both so that an algorithm can name it without knowing plans."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Choice"]


@dataclass(frozen=True)
class Choice:
    """What runs a message: an algorithm, and its pipeline segment (None: the algorithm's own)."""

    algorithm: str
    segment_bytes: int | None = None

    def __str__(self) -> str:
        """``ring`` or, with a segment, ``ring/256 KiB``: how logs and verdicts name it."""
        from autotune.util.units import format_bytes

        if self.segment_bytes is None:
            return self.algorithm
        return f"{self.algorithm}/{format_bytes(self.segment_bytes)}"
