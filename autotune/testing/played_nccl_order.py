"""The played NCCL's order check (`autotune.testing.played_nccl`): every launch on a played
communicator, compared through the job's store with each peer's launches that concern both.

NCCL's kernels wait for their peers: two ranks launching the same communicator's operations in
different orders, or interleaving two communicators' launches differently, hang. gloo, which
carries the data, would not, so `Order` checks instead and raises `OrderError` with both ranks'
sequences, as the job would hang on a GPU.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

__all__ = ["JITTER_ENV", "POLL_S", "Launch", "Order", "OrderError"]

#: Seconds of random delay before each launch (the environment of the ranks), default none.
JITTER_ENV = "AUTOTUNE_PLAYED_NCCL_JITTER_S"
#: NCCL's poll of a work's completion while a timed wait blocks the host.
POLL_S = 0.001
_KEYS = "played_nccl/order"


class OrderError(RuntimeError):
    """Two ranks launched NCCL operations in different orders: on a GPU the job would hang."""


@dataclass(frozen=True)
class Launch:
    """One launch on a played communicator, as this rank made it."""

    comm: str  # the group's name, the same on every member
    seq: int  # its place among the communicator's launches on this rank
    op: str  # "all_reduce", "broadcast", "all_gather", "barrier" or "p2p"
    nbytes: int  # a collective's bytes (0 for p2p)
    thread: str
    #: Point-to-point: the bytes of each send to, and receive from, each peer (global ranks).
    sends: tuple[tuple[int, int], ...] = ()
    recvs: tuple[tuple[int, int], ...] = ()

    def with_peer(self, peer: int) -> dict[str, Any]:
        """What this launch is to ``peer``: what the peer's matching launch must mirror."""
        out: dict[str, Any] = {"comm": self.comm, "op": self.op, "nbytes": self.nbytes}
        if self.op == "p2p":
            out["sends"] = [n for p, n in self.sends if p == peer]
            out["recvs"] = [n for p, n in self.recvs if p == peer]
        out["seq"], out["thread"] = self.seq, self.thread
        return out

    def peers(self, members: Sequence[int], me: int) -> list[int]:
        if self.op == "p2p":
            return sorted({p for p, _ in (*self.sends, *self.recvs)})
        return [m for m in members if m != me]


def _mirrors(mine: dict[str, Any], theirs: dict[str, Any]) -> bool:
    same = ("comm", "op", "nbytes")
    if any(mine[k] != theirs[k] for k in same):
        return False
    return mine.get("sends") == theirs.get("recvs") and mine.get("recvs") == theirs.get("sends")


def _say(entry: dict[str, Any]) -> str:
    what = entry["op"]
    if what == "p2p":
        what += f" send {entry['sends']} recv {entry['recvs']}"
    elif entry["nbytes"]:
        what += f" {entry['nbytes']} B"
    return f"{what} on group {entry['comm']} (its launch #{entry['seq']}), thread {entry['thread']}"


class Order:
    """This process's launches on played communicators, and their check against each peer's."""

    def __init__(self, refuse: Callable[[str], None]) -> None:
        """``refuse(comm)`` raises where a launch on ``comm`` cannot be made (aborted)."""
        self.refuse = refuse
        self.lock = threading.Lock()
        self.store: dist.Store | None = None
        self.rank = -1
        self.log: list[Launch] = []
        self.failure: OrderError | None = None
        self._per_comm: dict[str, int] = {}
        self._shared: dict[int, int] = {}  # peer -> launches shared with it so far
        self._unchecked: list[tuple[int, int, dict[str, Any]]] = []  # (peer, index, mine)
        self._jitter = 0.0
        self._random = random.Random()

    def reset(self, store: dist.Store, rank: int) -> None:
        with self.lock:
            self.store, self.rank = store, rank
            self.log.clear()
            self.failure = None
            self._per_comm.clear()
            self._shared.clear()
            self._unchecked.clear()
            self._jitter = float(os.environ.get(JITTER_ENV, "0") or 0)
            self._random = random.Random(rank)

    def launch(self, comm: str, members: Sequence[int], op: str, nbytes: int = 0,
               sends: tuple[tuple[int, int], ...] = (),
               recvs: tuple[tuple[int, int], ...] = ()) -> None:  # fmt: skip
        self.refuse(comm)
        if self._jitter:
            time.sleep(self._random.uniform(0.0, self._jitter))
        with self.lock:
            self._raise()
            seq = self._per_comm.get(comm, 0)
            self._per_comm[comm] = seq + 1
            entry = Launch(comm, seq, op, nbytes, threading.current_thread().name, sends, recvs)
            self.log.append(entry)
            store = self.store
            assert store is not None, "played NCCL: install() before the process group"
            for peer in entry.peers(members, self.rank):
                index = self._shared.get(peer, 0)
                self._shared[peer] = index + 1
                mine = entry.with_peer(peer)
                store.set(f"{_KEYS}/{self.rank}-{peer}/{index}", json.dumps(mine))
                self._unchecked.append((peer, index, mine))
            self._check(wait_s=0.0)

    def check(self, wait_s: float = 0.0) -> None:
        """Compare what the peers have launched so far (waiting up to ``wait_s`` for the rest);
        raise `OrderError` where a pair's sequences differ."""
        with self.lock:
            self._raise()
            self._check(wait_s)

    def _raise(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _check(self, wait_s: float) -> None:
        store = self.store
        assert store is not None
        deadline = time.monotonic() + wait_s
        left: list[tuple[int, int, dict[str, Any]]] = []
        for peer, index, mine in self._unchecked:
            key = f"{_KEYS}/{peer}-{self.rank}/{index}"
            while not store.check([key]) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if not store.check([key]):
                left.append((peer, index, mine))
                continue
            theirs = json.loads(store.get(key))
            if not _mirrors(mine, theirs):
                self.failure = OrderError(self._report(peer, index))
                raise self.failure
        self._unchecked = left

    def _report(self, peer: int, index: int) -> str:
        store = self.store
        assert store is not None
        first = max(0, index - 4)
        lines = [
            f"played NCCL: ranks {self.rank} and {peer} launched in different orders (on a GPU "
            f"the job would hang); their launches that concern both, from #{first}:"
        ]
        for who, other in ((self.rank, peer), (peer, self.rank)):
            lines.append(f"  rank {who}:")
            for i in range(first, index + 1):
                key = f"{_KEYS}/{who}-{other}/{i}"
                if store.check([key]):
                    lines.append(f"    #{i} {_say(json.loads(store.get(key)))}")
        return "\n".join(lines)
