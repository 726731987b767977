"""Where the plugin library is: the extension module pip built (tuner and profiler in one)."""

from __future__ import annotations

import importlib
from pathlib import Path

__all__ = ["library_path"]


def library_path() -> str:
    """The shared library to give NCCL as ``NCCL_TUNER_PLUGIN`` and ``NCCL_PROFILER_PLUGIN``."""
    path = importlib.import_module("autotune_nccl._tuner").__file__
    assert path is not None
    return str(Path(path).resolve())
