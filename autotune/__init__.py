"""autotune: swappable, live-tuned all-reduce for PyTorch DDP, with Prometheus metrics."""

from __future__ import annotations

from autotune import algorithms

__all__ = ["__version__", "algorithms"]
__version__ = "0.1.0"
