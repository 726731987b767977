"""Naive all-reduce baselines for autotune, loaded through the ``autotune.algorithms`` entry
points."""

from __future__ import annotations

from autotune_baselines.direct import DirectAllReduce
from autotune_baselines.star import StarAllReduce

__all__ = ["DirectAllReduce", "StarAllReduce"]
