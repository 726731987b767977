"""What a tuned plan depends on, and which job this is: the fingerprint that keys the storage
(backend, world size, nodes, ranks per node, device model, dtype), the workload a plan belongs to
within it (`workload_name`: the job's gradient layout, or a name the user gives), and torchrun's
identity of the job.

What is a fact about messages (a size class's screening) is kept per fingerprint, shared by every
job with it; what is a judgment about a job's step (the plan it locked, its fusion and bucket
size, its near miss) is kept per fingerprint and workload: docs/TUNER.md, "Persistence".
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.util.processes import ProcessId

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from autotune.comm.topology import Topology

__all__ = [
    "EARLIER",
    "SWEEP",
    "check_workload",
    "describe_layout",
    "describe_model",
    "device_model",
    "elastic_attempt",
    "elastic_run",
    "fingerprint",
    "fingerprint_key",
    "job_fingerprint",
    "workload_name",
]

#: The workload ``autotune sweep --tune`` stores its classes under: not a job's plan, but each
#: class's screening, which seeds the search of any job with the fingerprint.
SWEEP = "sweep"
#: The workload of plans stored before plans were kept per workload: whose job's they are is
#: not known, so they only seed a search, as a sweep's classes do.
EARLIER = "earlier"
#: Where a workload's name comes from the job's gradient layout.
LAYOUT_PREFIX = "layout-"


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


def workload_name(layout: Sequence[tuple[int, str]]) -> str:
    """The name of a job's plan where `Config.workload` gives none: ``layout-`` and a digest of
    its gradient layout, (bytes, dtype) of each bucket as DDP first builds them (the same model
    under the same DDP settings builds the same buckets; a different model, or a different
    ``bucket_cap_mb``, other buckets)."""
    digest = hashlib.sha1(
        json.dumps([[n, d] for n, d in layout]).encode(), usedforsecurity=False
    ).hexdigest()
    return LAYOUT_PREFIX + digest[:12]


def describe_model(module: torch.nn.Module) -> str:
    """A model in words a person reads, for `autotune show`: its class and parameter count
    (those that take gradients, as DDP all-reduces them)."""
    count = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return f"{type(module).__name__}, {count:,} parameters"


def describe_layout(layout: Sequence[tuple[int, str]], itemsize: int) -> str:
    """What a job's gradient layout says of its model where the model itself is not known (a
    hook registered without `autotune.register`): its parameter count."""
    count = sum(nbytes for nbytes, _ in layout) // max(1, itemsize)
    return f"{count:,} parameters"


def check_workload(name: object) -> None:
    """A ValueError saying why ``name`` may not be a `Config.workload`, if it may not."""
    what = "Config.workload"
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ValueError(
            f"{what}: expected a non-empty name without surrounding space, got {name!r}"
        )
    if "/" in name:
        raise ValueError(f"{what}: {name!r} has a '/', which the storage's keys use")
    if name in (SWEEP, EARLIER) or name.startswith(LAYOUT_PREFIX):
        raise ValueError(
            f"{what}: {name!r} is autotune's own ({SWEEP!r}: a sweep's classes; {EARLIER!r}: "
            f"plans stored before plans were kept per job; {LAYOUT_PREFIX}...: a job named by "
            "its gradient layout)"
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
