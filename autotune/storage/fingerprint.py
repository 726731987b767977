"""What a tuned plan depends on, and which job this is: the fingerprint that keys the storage
(backend, world size, nodes, ranks per node, device model, dtype) and torchrun's identity of
the job.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import TYPE_CHECKING

from autotune.util.processes import ProcessId

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from autotune.comm.topology import Topology

__all__ = [
    "device_model",
    "elastic_attempt",
    "elastic_run",
    "fingerprint",
    "fingerprint_key",
    "job_fingerprint",
]


def device_model(device_type: str, index: int | None = None) -> str:
    """The model of the device gradients live on: the GPU's name, or the CPU's."""
    if device_type == "cuda":
        import torch

        return torch.cuda.get_device_name(index)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def fingerprint(
    *,
    backend: str,
    world_size: int,
    nodes: int,
    device: str,
    dtype: str,
    ranks_per_node: str | None = None,
) -> dict[str, str | int]:
    """What a tuned plan depends on; a job with the same fingerprint can reuse it.

    ``ranks_per_node``: "4" where every node runs 4 ranks, "2+2+1" where they differ; None: an
    even split of ``world_size`` over ``nodes``.
    """
    if ranks_per_node is None:
        if world_size % nodes:
            raise ValueError(f"{world_size} ranks do not split evenly over {nodes} nodes")
        ranks_per_node = str(world_size // nodes)
    return {
        "backend": backend,
        "world_size": world_size,
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "device": device,
        "dtype": dtype,
    }


def job_fingerprint(
    group: ProcessGroup, device: torch.device, dtype: torch.dtype, topology: Topology
) -> dict[str, str | int]:
    """The fingerprint of all-reduces of ``dtype`` tensors on ``device`` over ``group``, whose
    ranks sit on nodes as ``topology`` (of `autotune.comm.topology.detect`) says."""
    import torch.distributed as dist

    from autotune.algorithms import backend_for

    return fingerprint(
        backend=backend_for(group, device),
        world_size=dist.get_world_size(group),
        nodes=topology.nodes,
        ranks_per_node=topology.layout,
        device=device_model(device.type, device.index),
        dtype=str(dtype).removeprefix("torch."),
    )


def fingerprint_key(fp: dict[str, str | int]) -> str:
    """A short, stable name for a fingerprint."""
    return hashlib.sha1(json.dumps(fp, sort_keys=True).encode(), usedforsecurity=False).hexdigest()[
        :12
    ]


def elastic_attempt() -> tuple[str, int] | None:
    """(run id, restart count) of this torchrun worker group, or None outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if not run_id or restart is None or not restart.isdigit():
        return None
    return run_id, int(restart)


def elastic_run() -> str | None:
    """This torchrun job, told apart from every other: its run id and its agent, the torchrun
    process that starts (and restarts) this worker, which outlives its attempts. The run id
    alone does not tell jobs apart: plain ``torchrun --master-port`` gives every job ``none``.
    None outside torchrun."""
    attempt = elastic_attempt()
    if attempt is None:
        return None
    agent = ProcessId.of(os.getppid())
    return f"{attempt[0]}@{agent.host}:{agent.pid}:{agent.started:.3f}"
