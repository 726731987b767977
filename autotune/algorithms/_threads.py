"""One intra-op thread for the reductions that a Python-driven algorithm runs.

A ring or a tree sums segments with ``Tensor.add_`` on the thread that drives it. With torch's
default intra-op threads (one per core: what ``mp.spawn`` users get), each add is an OpenMP
parallel region whose threads spin on after it, on the cores gloo's threads and the other ranks
need. gloo sums on one thread of its own; `one_thread` makes the driving thread do the same,
for that thread only (OpenMP's count is per thread; ``torch.set_num_threads`` would change the
whole process). Where torch runs on another threading runtime, or the OpenMP symbols are not
found, it does nothing. Measured effect: docs/BENCHMARKS.md, "With torch's default intra-op
threads".
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["one_thread"]


@functools.cache
def _openmp() -> tuple[Any, Any] | None:
    """(omp_get_max_threads, omp_set_num_threads) of the runtime torch loaded, or None."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        loaded = ctypes.CDLL(None)  # the process's global symbols, torch's OpenMP among them
        get, put = loaded.omp_get_max_threads, loaded.omp_set_num_threads
    except (OSError, AttributeError, TypeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, []
    put.restype, put.argtypes = None, [ctypes.c_int]
    return get, put


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block's torch CPU ops on the calling thread alone; other threads keep theirs."""
    omp = _openmp()
    if omp is None:
        yield
        return
    get, put = omp
    # torch sets a thread's OpenMP thread count at its first parallel op; have that happen
    # now, or it would undo ours.
    torch.get_num_threads()
    before = get()
    if before <= 1:
        yield
        return
    put(1)
    try:
        yield
    finally:
        put(before)
