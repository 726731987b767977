"""Where ranks run: this rank's place on its node (the launcher's word), and which ranks of a group
share a node (learnt by exchanging node ids, then checked against what the launcher says).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import warnings
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

__all__ = ["NODE_ID_ENV", "Topology", "detect", "local_rank", "node_id"]

#: Set to name this rank's node yourself (as NCCL_HOSTID does for NCCL): ranks with the same value
#: are one node. Unset, a node is a host name and a network namespace.
NODE_ID_ENV = "AUTOTUNE_NODE_ID"


def local_rank(default: int = 0) -> int:
    """This process's rank on its node: torchrun's ``LOCAL_RANK``, else ``default`` (a launcher
    that sets no LOCAL_RANK runs one node, where the global rank is the local one)."""
    raw = os.environ.get("LOCAL_RANK")
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"LOCAL_RANK={raw!r} is not a rank (torchrun sets 0, 1, ...)") from None


def node_id() -> str:
    """What names this rank's node: `NODE_ID_ENV` if set, else host name and network namespace.

    The namespace counts because ranks in two network namespaces (containers, or the emulated
    nodes of `autotune.testing.cluster`) cannot reach each other over loopback, even on one host.
    """
    given = os.environ.get(NODE_ID_ENV)
    if given:
        return given
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:  # not Linux: the host name alone
        netns = ""
    return f"{socket.gethostname()}/{netns}"


@dataclass(frozen=True)
class Topology:
    """Which node each rank of a group is on. Nodes are numbered by their lowest rank, and a
    node's ranks are in rank order (their local index)."""

    node_of: tuple[int, ...]

    def __post_init__(self) -> None:
        seen = -1
        for node in self.node_of:
            if node > seen + 1:
                raise ValueError(f"nodes must be numbered by their lowest rank: {self.node_of}")
            seen = max(seen, node)

    @classmethod
    def flat(cls, size: int) -> Topology:
        """One node holding every rank."""
        return cls((0,) * size)

    @property
    def size(self) -> int:
        return len(self.node_of)

    @property
    def nodes(self) -> int:
        return max(self.node_of, default=-1) + 1

    @cached_property
    def members(self) -> tuple[tuple[int, ...], ...]:
        """Each node's ranks, in rank order."""
        out: list[list[int]] = [[] for _ in range(self.nodes)]
        for rank, node in enumerate(self.node_of):
            out[node].append(rank)
        return tuple(tuple(m) for m in out)

    @property
    def ranks_per_node(self) -> tuple[int, ...]:
        return tuple(len(m) for m in self.members)

    @property
    def layout(self) -> str:
        """Ranks per node as a fingerprint writes it: "4" where every node runs 4, "2+2+1"."""
        counts = self.ranks_per_node
        return str(counts[0]) if len(set(counts)) == 1 else "+".join(map(str, counts))

    def local_index(self, rank: int) -> int:
        """``rank``'s place among its node's ranks."""
        return self.members[self.node_of[rank]].index(rank)

    def describe(self) -> str:
        """ "2 nodes x 2 ranks", or "3 nodes: 2+2+1 ranks" where they differ."""
        counts = self.ranks_per_node
        nodes = f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        if len(set(counts)) == 1:
            return f"{nodes} x {counts[0]} rank{'s' if counts[0] != 1 else ''}"
        return f"{nodes}: {'+'.join(map(str, counts))} ranks"


_lock = threading.Lock()
_known: dict[str, Topology] = {}
_world: list[ProcessGroup | None] = [None]


def detect(group: ProcessGroup | None = None, timeout: timedelta | None = None) -> Topology:
    """Learn which ranks of ``group`` (None: the world) share a node; collective on first call.

    Every rank sends its `node_id` (hashed) and torchrun's ``GROUP_RANK``; ranks with one id are
    one node. Where the launcher groups ranks differently (two agents on one host, or a container
    per rank), the ids win, with a warning: they say who can reach whom over loopback and shared
    memory, the launcher only how it was started. Later calls for the group return the answer.
    """
    base = dist.group.WORLD if group is None else group
    assert base is not None, "the default process group is not initialised"
    with _lock:
        if _world[0] is not dist.group.WORLD:  # a new world (init after destroy): names recur
            _known.clear()
            _world[0] = dist.group.WORLD
        known = _known.get(base.group_name)
    if known is not None:
        return known
    digest = hashlib.sha1(node_id().encode(), usedforsecurity=False).digest()
    mine = torch.tensor(
        [int.from_bytes(digest[:8], "little", signed=True), int(os.environ.get("GROUP_RANK", -1))],
        dtype=torch.int64,
    )
    from autotune.comm.groups import bookkeeping_device, current_device

    device = bookkeeping_device(base, current_device())
    size = dist.get_world_size(base)
    everyone = [torch.empty(2, dtype=torch.int64, device=device) for _ in range(size)]
    work = dist.all_gather(everyone, mine.to(device), group=base, async_op=True)
    assert work is not None
    if timeout is None:
        work.wait()
    else:
        work.wait(timeout)
    rows = [tuple(int(v) for v in t.tolist()) for t in everyone]
    topo = Topology(_number([ident for ident, _ in rows]))
    launcher = [group_rank for _, group_rank in rows]
    if all(g >= 0 for g in launcher):
        said = Topology(_number(launcher))
        if said != topo:
            warnings.warn(
                f"torchrun's GROUP_RANK puts ranks on {said.describe()} ({list(said.node_of)}), "
                f"but their hosts say {topo.describe()} ({list(topo.node_of)}); autotune uses "
                f"the hosts. Set {NODE_ID_ENV} on every rank to say which share a node.",
                RuntimeWarning,
                stacklevel=2,
            )
    with _lock:
        _known[base.group_name] = topo
    return topo


def _number(ids: list[int]) -> tuple[int, ...]:
    """Node numbers for per-rank ids, numbered in order of each id's lowest rank."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(i, len(first)) for i in ids)
