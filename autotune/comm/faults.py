"""Who failed first: ranks agree through the rendezvous store, and a failing rank lets its peers go.

Setup is a handshake (every rank says it is ready, or why not, before anyone waits on a
collective), and a failure during training ends in one verdict that every rank reports alike:
the first rank to name a culprit writes it, and every other rank reads it. What a rank names
comes from its own error, its local peers' processes, and every rank's heartbeat and progress
(`autotune.comm.liveness`). Store calls after setup are bounded: where the store's own host hangs,
every rank names that host, without the store.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.comm.groups import PeerError
from autotune.comm.liveness import Liveness, StoreUnreachable, local_suspect
from autotune.util.processes import ProcessId, state
from autotune.util.redact import redact

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
        #: Which of the states over ``group`` this board's is (0 for the first), the same on
        #: every rank: its keys, and the channel its traffic takes (`autotune.comm.groups`).
        self.sequence = n
        self.store = dist.PrefixStore(f"autotune/{group.group_name}/{n}/", store)
        self.group = group
        self.rank = dist.get_rank()
        self.ranks = dist.get_process_group_ranks(group)
        self.timeout_s = timeout_s
        self.clock = clock
        self.peers: dict[int, ProcessId] = {}
        #: The rank whose process serves the rendezvous store (None: a process outside the job,
        #: torchrun's agent or a launcher), as the ranks said at setup.
        self.store_host: int | None = self.rank if _serves(store) else None
        #: Heartbeats and progress, from `start_watching` on (None before).
        self.liveness: Liveness | None = None
        #: What each rank told the others at the last `agree` (its ``told``), by rank.
        self.told: dict[int, dict[str, Any]] = {}

    # -- setup ------------------------------------------------------------------------------

    def agree(
        self,
        phase: str,
        error: BaseException | None,
        same: Mapping[str, Any],
        told: Mapping[str, Any] | None = None,
    ) -> None:
        """Say this rank is ready for ``phase`` (or failed it with ``error``), then wait for every
        rank's word: raise at once if one failed, or if one's ``same`` differs from ours (a
        config the ranks must share). A rank that never answers is named at the timeout.
        ``told``: what this rank tells the others that may differ (JSON values), in `told` after.

        With ``error`` set this raises nothing itself: the caller raises its own error.
        """
        me = ProcessId.mine()
        mine = {"same": dict(same), "host": me.host, "pid": me.pid, "started": me.started}
        mine["serves_store"] = self.store_host == self.rank
        self.told = {self.rank: dict(told or {})}
        mine["told"] = self.told[self.rank]
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
                self.peers[r] = ProcessId(theirs["host"], theirs["pid"], theirs["started"])
                self.told[r] = theirs.get("told", {})
                if theirs.get("serves_store"):
                    self.store_host = r
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

    def start_watching(self) -> None:
        """After setup, on every rank: beat, and keep progress, until `close`."""
        self.liveness = Liveness(
            self.store,
            self.rank,
            self.ranks,
            self.timeout_s,
            self.peers,
            self.store_host,
        )

    def close(self) -> None:
        if self.liveness is not None:
            self.liveness.close()

    # -- failures ---------------------------------------------------------------------------

    def verdict(self, error: BaseException) -> Verdict:
        """Agree on who failed first, given this rank's ``error``; the first claim stands.

        A claim already in the store is taken as it is. Else a rank's own error (not a
        `PeerError`) makes it the culprit; a peer error names a local peer whose process exited,
        then whom the heartbeats and progress point to (`Liveness.suspect`), then the peer the
        failed operation waited on; a rank that can name nobody waits a moment for one that can.
        Where the store does not answer, every rank names its host the same way, without it.
        """
        liveness = self.liveness
        stood = None if liveness is None else liveness.stood_still()
        if stood is not None:
            return self._self_stopped(stood)
        try:
            claimed = self._claimed()
            if claimed:
                return _read_verdict(claimed)
            rank, reason = self._name(error)
            if rank is not None:
                agreed = self._call(lambda s: s.compare_set("verdict", "", f"{rank}|{reason}"))
            else:
                agreed = self._wait_for_verdict()
        except StoreUnreachable as exc:
            return self._without_store(exc)
        except Exception as exc:  # the store's host may be gone (rank 0, or the launcher)
            if liveness is None:  # during setup: what this rank saw, and that it is alone
                return Verdict(None, f"the rendezvous store is unreachable: {exc}")
            return self._without_store(exc)
        if not agreed:
            return Verdict(None, "no rank could tell")
        return _read_verdict(agreed)

    def _self_stopped(self, stood_s: float) -> Verdict:
        """This rank's process stood still past the timeout: it is the rank its peers gave up
        on. The claim in the store where there is one (the peers', naming it), else its own:
        the same rank either way, store or no store."""
        reason = (
            f"its process stood still for {stood_s:.1f} s, past timeout_s (stopped: SIGSTOP, "
            "a debugger); seen by itself once woken"
        )
        try:
            agreed = self._call(lambda s: s.compare_set("verdict", "", f"{self.rank}|{reason}"))
        except Exception:  # the store's host may have exited while this rank stood still
            return Verdict(self.rank, reason)
        return _read_verdict(agreed) if agreed else Verdict(self.rank, reason)

    def _name(self, error: BaseException) -> tuple[int | None, str]:
        if not isinstance(error, PeerError):
            return self.rank, redact(f"{type(error).__name__}: {_first_line(error)}")
        # A local peer that exited or is stopped first; then, where the heartbeats run, whom
        # they point to (`Liveness.suspect` looks at the local peers again as it reads them).
        suspect = (
            local_suspect(self.peers, self.rank)
            if self.liveness is None
            else self.liveness.suspect()
        )
        if suspect is not None:
            return suspect
        if error.peer is not None:
            return error.peer, redact(f"rank {self.rank} waited on it: {_first_line(error)}")
        return None, ""

    def _without_store(self, exc: BaseException) -> Verdict:
        """The store did not answer: the rank that serves it is hung or gone (a rank that is
        gone is seen as such on its host). Every rank reaches this the same way."""
        host = self.store_host
        if host is None:
            return Verdict(
                None,
                f"the rendezvous store, outside the job, did not answer ({exc}): the ranks "
                "cannot agree",
            )
        claim = f"{host}|its process serves the rendezvous store, which did not answer"
        if self.liveness is not None:
            # Written once the store answers again, if ever: the hung rank then agrees.
            self.liveness.bounded.submit(lambda s: s.compare_set("verdict", "", claim))
        seen = ""
        peer = self.peers.get(host)
        if peer is not None and peer.here:
            seen = {"exited": "; it has exited", "stopped": "; it is stopped"}.get(state(peer), "")
        return Verdict(
            host,
            f"its process serves the rendezvous store, which did not answer ({exc}){seen}",
        )

    def _call(self, fn: Callable[[dist.Store], Any]) -> Any:
        if self.liveness is None:
            return fn(self.store)
        return self.liveness.bounded.call(fn)

    def _claimed(self) -> bytes:
        """The claim in the store, or b"" where no rank has made one."""
        return bytes(self._call(lambda s: s.get("verdict") if s.check(["verdict"]) else b""))

    def _wait_for_verdict(self) -> bytes:
        deadline = self.clock() + min(VERDICT_WAIT_S, self.timeout_s)
        while self.clock() < deadline:
            claimed = self._claimed()
            if claimed:
                return claimed
            time.sleep(0.02)
        return b""


def _read_verdict(raw: bytes) -> Verdict:
    who, _, why = bytes(raw).decode().partition("|")
    return Verdict(int(who), why)


def _serves(store: dist.Store) -> bool:
    """Whether this process serves ``store`` (a TCPStore's server listens on its port here)."""
    import psutil

    tcp = store
    while isinstance(tcp, dist.PrefixStore):
        tcp = tcp.underlying_store
    if not isinstance(tcp, dist.TCPStore):
        return False
    me = psutil.Process()
    connections = getattr(me, "net_connections", None) or me.connections  # psutil < 6
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == tcp.port
        for c in connections(kind="tcp")
    )


def release(groups: list[ProcessGroup]) -> None:
    """Abort ``groups`` after a failure, so that peers waiting on this rank fail now instead of
    at their timeout (gloo closes its connections; NCCL aborts its communicators)."""
    for group in groups:
        try:
            group.abort()
        except Exception as exc:  # the failure being reported matters more
            _log.warning("autotune: aborting process group %s failed: %r", group.group_name, exc)


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
