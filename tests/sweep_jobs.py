"""What the sweep tests run on spawned ranks."""

from __future__ import annotations

from typing import Any

from broken_algorithms import LosesLastElement

from autotune.algorithms import register
from autotune.sweep import SweepOptions, run_sweep


def sweep(rank: int, world_size: int, options: dict[str, Any], json_path: str | None) -> Any:
    """`run_sweep` as `autotune sweep` runs it, with a broken algorithm registered."""
    register(LosesLastElement.name, LosesLastElement, replace=True)
    return run_sweep(SweepOptions(**options), command="test", json_path=json_path).to_json()
