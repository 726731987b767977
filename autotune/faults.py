"""Who failed first: ranks agree through the rendezvous store, and a failing rank lets its peers go.

Setup is a handshake (every rank says it is ready, or why not, before anyone waits on a
collective), and a failure during training ends in one verdict that every rank reports alike.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms import PeerError
from autotune.redact import redact

__all__ = ["FailureBoard", "Verdict", "release"]

_log = logging.getLogger("autotune")

#: How long a rank that cannot name a culprit waits for one that can.
VERDICT_WAIT_S = 5.0

_sequence: dict[str, itertools.count[int]] = {}


@dataclass(frozen=True)
class Verdict:
    """The rank that failed first (None: nobody could tell) and what is known of why."""

    rank: int | None
    reason: str

    def describe(self) -> str:
        if self.rank is None:
            return f"the failed rank is unknown ({self.reason})"
        return f"rank {self.rank} failed first ({self.reason})"


@dataclass(frozen=True)
class _Peer:
    host: str
    pid: int
    started: float  # the process's creation time, so a reused pid is not taken for it


class FailureBoard:
    """Keys under ``autotune/<group>/<n>/`` in the rendezvous store, for one `AutotuneState`.

    Construct it on every rank of ``group`` in the same order (as the states are). ``store``
    None: the default group's store (torch keeps it private; there is no public accessor).
    """

    def __init__(
        self,
        group: ProcessGroup,
        timeout_s: float,
        store: dist.Store | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if store is None:
            store = dist.distributed_c10d._get_default_store()
        n = next(_sequence.setdefault(group.group_name, itertools.count()))
        self.store = dist.PrefixStore(f"autotune/{group.group_name}/{n}/", store)
        self.group = group
        self.rank = dist.get_rank()
        self.ranks = dist.get_process_group_ranks(group)
        self.timeout_s = timeout_s
        self.clock = clock
        self.peers: dict[int, _Peer] = {}

    # -- setup ------------------------------------------------------------------------------

    def agree(self, phase: str, error: BaseException | None, same: Mapping[str, Any]) -> None:
        """Say this rank is ready for ``phase`` (or failed it with ``error``), then wait for every
        rank's word: raise at once if one failed, or if one's ``same`` differs from ours (a
        config the ranks must share). A rank that never answers is named at the timeout.

        With ``error`` set this raises nothing itself: the caller raises its own error.
        """
        mine = {"same": dict(same), "host": socket.gethostname(), "pid": os.getpid()}
        mine["started"] = _process_started(os.getpid())
        if error is not None:
            mine["error"] = redact(f"{type(error).__name__}: {error}")
        self.store.set(f"{phase}/{self.rank}", json.dumps(mine, default=str))
        if error is not None:
            return
        deadline = self.clock() + self.timeout_s
        waiting = [r for r in self.ranks if r != self.rank]
        pause = 0.001
        while waiting:
            for r in list(waiting):
                key = f"{phase}/{r}"
                if not self.store.check([key]):
                    continue
                waiting.remove(r)
                theirs = json.loads(self.store.get(key))
                self.peers[r] = _Peer(theirs["host"], theirs["pid"], theirs["started"])
                if "error" in theirs:
                    raise PeerError(
                        f"autotune setup ({phase}): rank {r} failed: {theirs['error']}", rank=r
                    )
                differ = sorted(
                    k for k in {**same, **theirs["same"]} if theirs["same"].get(k) != same.get(k)
                )
                if differ:
                    detail = "; ".join(
                        f"{k}: rank {r} has {theirs['same'].get(k)!r}, rank {self.rank} has "
                        f"{same.get(k)!r}"
                        for k in differ
                    )
                    raise ValueError(
                        f"autotune setup: ranks must share these settings, and do not: {detail}"
                    )
            if waiting and self.clock() > deadline:
                raise PeerError(
                    f"autotune setup ({phase}): ranks {waiting} did not reach it within "
                    f"{self.timeout_s:g} s (Config.timeout_s)",
                    rank=waiting[0],
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    # -- failures ---------------------------------------------------------------------------

    def verdict(self, error: BaseException) -> Verdict:
        """Agree on who failed first, given this rank's ``error``; the first claim stands.

        A rank's own error (not a `PeerError`) makes it the culprit. A peer error names a peer
        on this host whose process is gone, else the peer the failed operation waited on; a
        rank that can name nobody waits a moment for a rank that can.
        """
        if isinstance(error, PeerError):
            dead = self._dead_peers()
            if dead:
                rank, reason = dead[0], f"its process exited; seen by rank {self.rank}"
            elif error.peer is not None:
                reason = redact(f"rank {self.rank} waited on it: {_first_line(error)}")
                rank = error.peer
            else:
                rank, reason = None, ""
        else:
            rank, reason = self.rank, redact(f"{type(error).__name__}: {_first_line(error)}")
        try:
            if rank is not None:
                agreed = self.store.compare_set("verdict", "", f"{rank}|{reason}")
            else:
                agreed = self._wait_for_verdict()
        except Exception as exc:  # the store's host (rank 0, or the launcher) may be gone too
            return Verdict(rank, reason or f"the rendezvous store is unreachable: {exc}")
        if not agreed:
            return Verdict(None, "no rank could tell")
        who, _, why = agreed.decode().partition("|")
        return Verdict(int(who), why)

    def _wait_for_verdict(self) -> bytes:
        deadline = self.clock() + min(VERDICT_WAIT_S, self.timeout_s)
        while self.clock() < deadline:
            if self.store.check(["verdict"]):
                return self.store.get("verdict")
            time.sleep(0.02)
        return b""

    def _dead_peers(self) -> list[int]:
        """Ranks on this host whose process has exited (other hosts' cannot be seen from here)."""
        host = socket.gethostname()
        return [
            r
            for r, p in sorted(self.peers.items())
            if p.host == host and _process_started(p.pid) != p.started
        ]


def release(groups: list[ProcessGroup]) -> None:
    """Abort ``groups`` after a failure, so that peers waiting on this rank fail now instead of
    at their timeout (gloo closes its connections; NCCL aborts its communicators)."""
    for group in groups:
        try:
            group.abort()
        except Exception as exc:  # the failure being reported matters more
            _log.warning("autotune: aborting process group %s failed: %r", group.group_name, exc)


def _process_started(pid: int) -> float:
    """When process ``pid`` started (0.0: it no longer runs)."""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return 0.0
        return p.create_time()
    except psutil.NoSuchProcess:
        return 0.0


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
