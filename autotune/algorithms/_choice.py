"""What runs a message: the name the algorithms and the plans share (`autotune.plan` re-exports
it), here below both so that an algorithm can name it without knowing plans."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["COMPRESSIBLE", "WIRES", "Choice", "split_label", "wire_dtype", "wire_of"]

#: The wire dtypes a message may be compressed to (`Choice.wire`), by name.
WIRES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: The gradient dtypes a compressed choice casts; narrower ones travel as they are.
COMPRESSIBLE = (torch.float32, torch.float64)


def wire_dtype(name: str) -> torch.dtype:
    """The dtype a wire name stands for; ValueError naming the choices for another."""
    try:
        return WIRES[name]
    except KeyError:
        raise ValueError(f"unknown wire dtype {name!r}: choose from {', '.join(WIRES)}") from None


@dataclass(frozen=True)
class Choice:
    """What runs a message: an algorithm, its pipeline segment (None: the algorithm's own), and
    the dtype it travels in (`WIRES`; None: the gradient's own). A compressed choice sums a copy
    of the message cast to ``wire``, divided by the world size first, and casts the sum back."""

    algorithm: str
    segment_bytes: int | None = None
    wire: str | None = None

    def __post_init__(self) -> None:
        if self.wire is not None:
            wire_dtype(self.wire)

    @classmethod
    def parse(cls, label: str, segment_bytes: int | None = None) -> Choice:
        """The choice a `label` names (``ring``, ``ring+bf16``), with ``segment_bytes``."""
        algorithm, wire = split_label(label)
        return cls(algorithm, segment_bytes, wire)

    @property
    def span(self) -> float:
        """The bytes its segment holds: the whole message (inf) where it runs unsegmented."""
        return math.inf if self.segment_bytes is None else self.segment_bytes

    @property
    def label(self) -> str:
        """``ring``, or ``ring+bf16`` on a compressed wire: how records, stats and the metrics'
        ``algorithm`` label name what ran."""
        return self.algorithm if self.wire is None else f"{self.algorithm}+{self.wire}"

    def __str__(self) -> str:
        """``ring``, ``ring/256 KiB`` with a segment, ``ring/256 KiB+bf16`` on a compressed wire:
        how logs and verdicts name it."""
        from autotune.util.units import format_bytes

        text = self.algorithm
        if self.segment_bytes is not None:
            text += f"/{format_bytes(self.segment_bytes)}"
        return text if self.wire is None else f"{text}+{self.wire}"


def split_label(label: str) -> tuple[str, str | None]:
    """A `Choice.label` taken apart: the algorithm, and the wire after a "+" (None: none)."""
    algorithm, plus, wire = label.partition("+")
    return algorithm, wire if plus else None


def wire_of(choice: Choice, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype ``choice`` sends a message of ``dtype`` in, where it compresses it (None: the
    message travels as it is)."""
    if choice.wire is None or dtype not in COMPRESSIBLE:
        return None
    return wire_dtype(choice.wire)
