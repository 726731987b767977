"""One intra-op thread for the reductions that a Python-driven algorithm runs.

A ring or a tree sums segments with ``Tensor.add_`` on the thread that drives it. With torch's
default intra-op threads (one per core: what ``mp.spawn`` users get; torchrun sets 1), each such
add is an OpenMP parallel region, and the team of threads it wakes spins on after it, on cores
that gloo's threads and the other ranks need. At 16 MiB and 2 ranks on 2 cores that made the ring
0.65x as fast as native; summing on one thread, 1.10-1.15x (docs/BENCHMARKS.md). gloo sums on one
thread of its own; so does this, for the thread running the algorithm only.

OpenMP's thread count is per thread (``omp_set_num_threads`` sets the calling thread's), and
``torch.set_num_threads`` would change it for the whole process. Where torch runs on another
threading runtime, or the OpenMP symbols are not found, this does nothing.
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
