"""Whether the ranks on one host ask for more CPU threads than it has cores, said once.

torch gives each process one intra-op thread per core by default, so N ranks started by
``mp.spawn`` (or any launcher that leaves ``OMP_NUM_THREADS`` unset) run N threads a core
between them; torchrun sets ``OMP_NUM_THREADS=1`` for this reason. On CPU tensors backward, the
optimizer and the all-reduce then compete for the same cores, which no all-reduce plan wins
back (docs/BENCHMARKS.md, "With torch's default intra-op threads"). The thread count is the
user's to set (``torch.set_num_threads`` changes the whole process), so `oversubscription` says
what to set instead of setting it; the state's lowest rank on a host logs it at its first CPU
bucket.
"""

from __future__ import annotations

import os

__all__ = ["oversubscription", "usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def oversubscription(ranks_here: int, threads: int, cores: int) -> str | None:
    """Why ``ranks_here`` ranks of ``threads`` intra-op threads each oversubscribe ``cores``
    cores, and what to set instead; None where they fit, or where each rank runs one thread
    already (more ranks than cores is the job's layout, which fewer threads cannot help)."""
    if threads <= 1 or ranks_here * threads <= cores:
        return None
    fit = max(1, cores // ranks_here)
    return (
        f"{ranks_here} ranks on this host each run {threads} intra-op threads on {cores} cores "
        f"({ranks_here * threads} threads): on CPU tensors, backward, the optimizer and the "
        f"all-reduce compete for the cores, which no all-reduce plan wins back. torchrun sets "
        f"OMP_NUM_THREADS=1; with mp.spawn or another launcher, set OMP_NUM_THREADS={fit} or call "
        f"torch.set_num_threads({fit}) in each rank. (The example's mlp at 2 ranks on 2 cores: "
        f"plain DDP's step 4.2x as long with 2 threads a rank as with 1; docs/BENCHMARKS.md)"
    )
