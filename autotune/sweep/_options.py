"""What a sweep measures, with nccl-tests' names and defaults where they carry over."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from autotune.algorithms import BUILTINS, available
from autotune.util.names import unknown

__all__ = ["DTYPES", "SweepOptions", "dtype_name"]

#: nccl-tests' type names (``-d``) and the torch dtypes they stand for.
DTYPES: dict[str, torch.dtype] = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
_ALIASES = {
    "float32": "float",
    "fp32": "float",
    "float64": "double",
    "fp64": "double",
    "float16": "half",
    "fp16": "half",
    "bf16": "bfloat16",
}


def dtype_name(text: str) -> str:
    """nccl-tests' name for a dtype given as nccl-tests or torch write it ("half", "fp16")."""
    name = _ALIASES.get(text.lower().removeprefix("torch."), text.lower())
    if name not in DTYPES:
        raise ValueError(
            f"unsupported dtype {text!r}: all-reduce here sums floating-point tensors; "
            f"choose one of {', '.join(DTYPES)} (or float32, float64, float16, bf16)"
        )
    return name


@dataclass(frozen=True)
class SweepOptions:
    """One sweep: which sizes, how often, which algorithms, and what else to measure."""

    min_bytes: int = 8
    """Smallest message (nccl-tests ``-b``)."""

    max_bytes: int = 32 << 20
    """Largest message (``-e``)."""

    step_factor: int | None = 2
    """Multiply the size by this each step (``-f``); None: add ``step_bytes`` instead."""

    step_bytes: int = 1 << 20
    """Add this to the size each step when there is no factor (``-i``)."""

    iters: int = 20
    """Timed iterations per size and algorithm (``-n``)."""

    warmup: int = 5
    """Untimed iterations before them (``-w``)."""

    check: int = 1
    """Iterations whose results are checked against the exact sum (``-c``; 0: no check)."""

    dtype: str = "float"
    """nccl-tests' type name (``-d``): float, double, half or bfloat16."""

    algorithms: tuple[str, ...] | None = None
    """The algorithms to sweep; None: every registered one, plugins included."""

    segment_bytes: int | None = None
    """Pipeline segment for the segmented algorithms; None: each algorithm's default."""

    backend: str = "gloo"
    """gloo or nccl."""

    device: str | None = None
    """cpu or cuda; None: cuda for nccl, cpu for gloo."""

    p2p: bool = False
    """Also measure point-to-point bandwidth (each rank sends to the next): the ring's ceiling."""

    tune: bool = False
    """Tune each size class first (Optuna, algorithm x segment) and store the plan for jobs."""

    tune_algorithms: tuple[str, ...] | None = None
    """Candidates for tuning; None: what a job's "auto" chooses among (``AUTOTUNE_ALGORITHMS``,
    else the built-ins)."""

    tune_trials: int = 100
    """Trials per size class at most; a smaller budget lets Optuna's sampler pick which."""

    storage: str | None = None
    """Optuna storage URL for ``tune``; None: ``AUTOTUNE_STORAGE``, else the user cache's SQLite."""

    timeout_s: float = 300.0
    """How long a rank waits for a peer before the sweep fails."""

    def __post_init__(self) -> None:
        for name in ("min_bytes", "max_bytes", "step_bytes", "iters", "warmup", "check"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
        if self.max_bytes < self.min_bytes:
            raise ValueError(
                f"max_bytes ({self.max_bytes}) is below min_bytes ({self.min_bytes}): -e < -b"
            )
        if self.iters < 1:
            raise ValueError("iters must be >= 1: there is nothing to report without one (-n)")
        if self.step_factor is not None and self.step_factor < 2:
            raise ValueError(f"step factor must be >= 2, got {self.step_factor} (-f)")
        if self.step_factor is None and self.step_bytes < 1 and self.max_bytes > self.min_bytes:
            raise ValueError("step_bytes must be >= 1 to go from min_bytes to max_bytes (-i)")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        names = available()
        for field_name in ("algorithms", "tune_algorithms"):
            chosen = getattr(self, field_name)
            if chosen is None:
                continue
            wrong = [a for a in chosen if a not in names]
            if wrong or not chosen:
                what = unknown("algorithm", wrong, names) if wrong else "empty"
                raise ValueError(f"{field_name}: {what}; registered: {', '.join(names)}")
            object.__setattr__(self, field_name, tuple(chosen))
        if self.segment_bytes is not None and self.segment_bytes < 1:
            raise ValueError(f"segment_bytes must be >= 1, got {self.segment_bytes}")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {self.backend!r}")
        if self.device not in (None, "cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.backend == "nccl" and self.device == "cpu":
            raise ValueError("NCCL reduces CUDA tensors only: use --device cuda or --backend gloo")
        if self.tune_trials < 1:
            raise ValueError(f"tune_trials must be >= 1, got {self.tune_trials}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number, got {self.timeout_s!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def device_type(self) -> str:
        return self.device or ("cuda" if self.backend == "nccl" else "cpu")

    @property
    def swept(self) -> tuple[str, ...]:
        """The algorithms swept, in order: as given, else the built-ins, then plugins by name
        (less, on the group, those it cannot run: `autotune.algorithms.agreed`)."""
        if self.algorithms is not None:
            return self.algorithms
        builtins = [cls.name for cls in BUILTINS]
        return (*builtins, *(a for a in available() if a not in builtins))

    def counts(self) -> list[int]:
        """Element counts, smallest first: each size rounded down to whole elements, as
        nccl-tests does, without repeats."""
        elem = self.torch_dtype.itemsize
        out: list[int] = []
        size = self.min_bytes
        while size <= self.max_bytes:
            count = size // elem
            if not out or count != out[-1]:
                out.append(count)
            nxt = size * self.step_factor if self.step_factor else size + self.step_bytes
            if nxt <= size:
                if size:
                    break  # -i 0: a single size
                nxt = 1  # -b 0 with a factor: 0 stays 0; go on from 1 byte
            size = nxt
        return out
