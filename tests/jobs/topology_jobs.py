"""What the topology tests run on spawned ranks: nodes named per rank, then detection."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

import torch

from autotune.comm.topology import NODE_ID_ENV, detect
from autotune.storage import job_fingerprint


def detect_as(
    rank: int, world_size: int, node_ids: Sequence[str], group_ranks: Sequence[int] | None
) -> tuple[tuple[int, ...], list[str], dict[str, str | int], bool]:
    """Name this rank's node ``node_ids[rank]`` (and torchrun's GROUP_RANK), then detect."""
    os.environ[NODE_ID_ENV] = node_ids[rank]
    if group_ranks is not None:
        os.environ["GROUP_RANK"] = str(group_ranks[rank])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        topo = detect()
    again = detect()  # answered from what was learnt: no second collective to line up
    fp = job_fingerprint(
        torch.distributed.group.WORLD,  # type: ignore[arg-type]
        torch.device("cpu"),
        torch.float32,
        topo,
    )
    return topo.node_of, [str(w.message) for w in caught], fp, again is topo
