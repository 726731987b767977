"""Which NCCL this process runs: the library's answer, not the header torch was built against.

`torch.cuda.nccl.version()` returns the ``NCCL_MAJOR/MINOR/PATCH`` of the header PyTorch was
compiled with (torch/csrc/cuda/nccl.cpp, ``version()``: a ``constexpr``), so it reports the
wheel's NCCL even where another libnccl.so.2 is preloaded and is the one every collective runs
on. What NCCL itself answers (``ncclGetVersion``) is what decides, for example, whether two
ranks may share one GPU (NCCL 2.30's ``NCCL_MULTI_RANK_GPU_ENABLE``).

Example::

    >>> runtime_version()  # with LD_PRELOAD=/tmp/libnccl.so.2 (NCCL 2.30.7) on a CUDA build
    (2, 30, 7)
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["decode", "runtime_version"]


def decode(code: int) -> tuple[int, int, int]:
    """``ncclGetVersion``'s integer as (major, minor, patch).

    NCCL 2.9 and later encode ``major * 10000 + minor * 100 + patch`` (nccl.h.in's
    ``NCCL_VERSION(X,Y,Z)``); earlier releases ``major * 1000 + minor * 100 + patch``.
    """
    if code < 0:
        raise ValueError(f"ncclGetVersion gave {code}")
    if code >= 20900:
        return code // 10000, code % 10000 // 100, code % 100
    return code // 1000, code % 1000 // 100, code % 100


def _ask(lib: ctypes.CDLL) -> tuple[int, int, int] | None:
    try:
        get = lib.ncclGetVersion
    except AttributeError:
        return None
    out = ctypes.c_int(-1)
    if get(ctypes.byref(out)) != 0:  # ncclSuccess
        return None
    return decode(out.value)


def _mapped_libraries() -> list[str]:
    """The libnccl files mapped into this process, in the order /proc/self/maps lists them."""
    seen: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                if os.path.basename(path).startswith("libnccl.so") and path not in seen:
                    seen.append(path)
    except OSError:
        return []
    return seen


def runtime_version() -> tuple[int, int, int] | None:
    """The version of the NCCL library that torch's calls reach; None where none is loaded.

    Imports torch first (its CUDA build loads libnccl.so.2). The process's global scope is
    asked first: a library in ``LD_PRELOAD`` is there, ahead of the one libtorch_cuda.so names,
    so its symbols are the ones torch binds to. Else the first libnccl mapped into the process.
    """
    import torch  # noqa: F401  (loads libnccl.so.2 where torch is built with NCCL)

    found = _ask(ctypes.CDLL(None))
    if found is not None:
        return found
    for path in _mapped_libraries():
        try:
            found = _ask(ctypes.CDLL(path))
        except OSError:
            continue
        if found is not None:
            return found
    return None


if __name__ == "__main__":  # python -m autotune.comm.nccl_version: what scripts check
    v = runtime_version()
    print("none" if v is None else ".".join(map(str, v)))
