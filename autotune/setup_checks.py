"""What `AutotuneState` checks, agrees on and derives at construction, before anything runs:
the settings every rank must share, the fusion size to start with, the fixed algorithms no rank
may run under another's name, a host whose ranks oversubscribe its cores, and a torchrun restart
on a store that keeps the last attempt's keys."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import fields
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms import agreed, current_device, get_algorithm_class, split_label
from autotune.comm.faults import FailureBoard
from autotune.comm.groups import backend_name
from autotune.config import Config
from autotune.plan import BASELINE_CHOICE, Table
from autotune.storage import elastic_attempt
from autotune.util.cores import oversubscription, usable_cores
from autotune.util.units import count

__all__ = [
    "fusion_bytes_at_start",
    "oversubscribed_here",
    "refuse_what_cannot_run",
    "shared_settings",
    "warn_restart_on_shared_store",
]


def refuse_what_cannot_run(config: Config, table: Table | None, group: ProcessGroup) -> None:
    """Collectively: a fixed algorithm (``Config.algorithm``, or a plan file's) that some rank
    cannot run its own schedule for is refused, on every rank alike, with what it needs: it
    would run something else under its name (an nccl.* cell on gloo runs gloo's all-reduce), and
    `plan()` and `stats()` would report it. "auto" never offers such a one (the tuner's
    candidates are agreed the same way)."""
    fixed = split_label(config.algorithm)[0]  # ring+bf16 runs ring's schedule
    asked = [] if config.algorithm == "auto" else [fixed]
    if table is not None:
        asked += sorted({e.choice.algorithm for e in table.classes.values()} - set(asked))
    asked = [a for a in asked if a != BASELINE_CHOICE.algorithm]
    if not asked:
        return
    device = current_device()
    can = agreed(asked, group, device, timedelta(seconds=config.timeout_s))
    refused = [a for a in asked if a not in can]
    if not refused:
        return
    where = (
        f"{backend_name(group)} backend, {device.type} tensors, "
        f"{count(dist.get_world_size(group), 'rank')}"
    )
    reasons = []
    for name in refused:
        cls = get_algorithm_class(name)
        reason = f"{name} runs on {' or '.join(cls.runs_on)}"
        reasons.append(reason + (f" and needs {cls.needs}" if cls.needs else ""))
    source = "Config.algorithm" if refused[0] == fixed else "the plan file"
    raise ValueError(
        f"{source}: {', '.join(refused)} cannot run its own schedule on this job ({where}); "
        f"{'; '.join(reasons)}. `autotune algorithms` lists what runs here; 'auto' chooses "
        "among those"
    )


def warn_restart_on_shared_store() -> None:
    """torchrun restarted this worker group on its agent's store, shared across attempts, which
    still holds the last attempt's keys: a group made now (autotune's too) may read a dead peer's
    address and fail to connect. docs/FAULTS.md, "Elastic restarts"."""
    attempt = elastic_attempt()
    if attempt is None or attempt[1] == 0:
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        warnings.warn(
            f"torchrun restarted this worker group (attempt {attempt[1]}) on its agent's shared "
            "store, which keeps the last attempt's keys: process groups made now can connect to "
            "dead peers ('Connection refused'). Run torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment",
            stacklevel=3,
        )


def fusion_bytes_at_start(config: Config, table: Table | None) -> int:
    """The engine's fusion size from the start: the config's, else a plan file's (0: off). From
    then on only the tuner changes it (`Tuner`, at the orders of an iteration's end)."""
    if config.fusion_bytes is not None:
        return config.fusion_bytes
    if table is not None and table.fusion_bytes is not None:
        return table.fusion_bytes
    return 0


#: Config fields a rank may set for itself; every other field must be the same on every rank.
_PER_RANK = ("storage", "metrics_port", "metrics_host", "job", "plan_file")


def shared_settings(config: Config, table: Table | None) -> dict[str, object]:
    """What every rank must agree on: the config's shared fields and the plan file's content."""
    shared: dict[str, object] = {
        f.name: getattr(config, f.name) for f in fields(config) if f.name not in _PER_RANK
    }
    shared["plan"] = None if table is None else table.to_json()
    read_back: dict[str, object] = json.loads(json.dumps(shared))  # as the others will read it
    return read_back


def oversubscribed_here(board: FailureBoard) -> str | None:
    """On the lowest of the board's ranks on this host, `oversubscription`'s word on them (the
    intra-op threads as the user set them on this, the main thread); elsewhere None."""
    here = [r for r, peer in board.peers.items() if peer.here] + [board.rank]
    if board.rank != min(here):
        return None
    return oversubscription(len(here), torch.get_num_threads(), usable_cores())
