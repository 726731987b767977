"""Which algorithms a group can run: each says for itself (`AllReduceAlgorithm.offered`), and
every rank must say yes, since every rank runs the same plan."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms._registry import get_algorithm_class
from autotune.comm.groups import bookkeeping_device

__all__ = ["agreed"]

_log = logging.getLogger("autotune")


def agreed(
    names: Sequence[str], group: ProcessGroup, device: torch.device, timeout: timedelta
) -> tuple[str, ...]:
    """``names`` less those some rank of ``group`` cannot run for ``device`` tensors.

    Collective over ``group``: every rank passes the same names. An algorithm whose check
    raises is left out on that rank (with a warning), so the others still agree."""
    if not names:
        return ()
    mine = []
    for name in names:
        try:
            mine.append(get_algorithm_class(name).offered(group, device))
        except Exception as exc:  # one algorithm's check must not stop the job
            _log.warning(
                "autotune: leaving out %s: checking whether it can run failed: %r", name, exc
            )
            mine.append(False)
    flags = torch.tensor(mine, dtype=torch.int64).to(bookkeeping_device(group, device))
    work = dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group, async_op=True)
    assert work is not None
    work.wait(timeout)
    everyone = [bool(v) for v in flags.tolist()]
    left_out = [n for n, ok, me in zip(names, everyone, mine, strict=True) if me and not ok]
    if left_out:
        _log.warning(
            "autotune: leaving out %s: another rank cannot run %s",
            ", ".join(left_out),
            "it" if len(left_out) == 1 else "them",
        )
    return tuple(n for n, ok in zip(names, everyone, strict=True) if ok)
