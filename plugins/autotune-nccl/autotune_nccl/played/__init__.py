"""NCCL's side of the plugins' C ABI, played from Python: the structs NCCL finds in the library,
the cost tables and event descriptors it passes, and one communicator's calls as each NCCL
release makes them (`tuner`: ncclTunerPlugin_v2 to _v7; `profiler`: ncclProfiler_v3 to _v7).
The plugin's tests, ``python -m autotune_nccl.selfcheck`` and ranks that play NCCL on CPU use it.
"""

from __future__ import annotations

__all__ = ["ok"]


def ok(rc: int) -> None:
    """A plugin call's ncclResult_t: anything but ncclSuccess (0) is the plugin's failure."""
    if rc != 0:
        raise RuntimeError(f"the plugin returned ncclResult_t {rc} where NCCL expects 0")
