"""Who is alive and how far it got: every rank's heartbeat and progress, kept in the rendezvous
store, so that a hang is blamed on the rank that hangs, the same on every rank.

A thread per state writes this rank's heartbeat and its progress (iterations begun) under
``live/<rank>`` once per period. Nobody reads them until something failed; then `Liveness.suspect`
names the rank that most likely failed first: a local peer whose process exited or is stopped,
a peer whose heartbeat stopped, or the peer furthest behind. Store calls made while diagnosing
give up after a bound (`BoundedStore`): a store whose host hangs (rank 0 under ``mp.spawn``-style
launchers) must not hang the diagnosis with it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

import torch.distributed as dist

from autotune.util.processes import ProcessId, state

__all__ = ["BoundedStore", "Liveness", "StoreUnreachable", "local_suspect", "period_for"]

_log = logging.getLogger("autotune")

T = TypeVar("T")

#: The longest a store call made while diagnosing may take (capped by the state's timeout_s).
STORE_CALL_S = 5.0


class StoreUnreachable(TimeoutError):
    """The rendezvous store did not answer within the bound."""


def period_for(timeout_s: float) -> float:
    """Seconds between heartbeats: a tenth of the timeout, between 50 ms and 1 s."""
    return min(1.0, max(0.05, timeout_s / 10))


def _clone(store: dist.Store) -> dist.Store:
    """A connection of its own to ``store`` (a TCPStore's client is not shared between threads);
    a store that cannot be cloned (a HashStore, an old torch) is used as it is."""
    clone = getattr(store, "clone", None)
    try:
        return store if clone is None else cast(dist.Store, clone())
    except RuntimeError:
        return store


class BoundedStore:
    """Calls on a store that give up after ``timeout_s`` with `StoreUnreachable`.

    A TCPStore client waits on its server for as long as the server's process is stopped: the
    calls run on a thread of their own, which is left waiting while the caller goes on. While
    it waits, later calls give up at their bound too: the store is unreachable for all of them.
    """

    def __init__(self, store: dist.Store, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._store = _clone(store)
        self._calls: queue.SimpleQueue[
            tuple[Callable[[dist.Store], object], concurrent.futures.Future[object]] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="autotune-store", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[dist.Store], T], timeout_s: float | None = None) -> T:
        bound = self.timeout_s if timeout_s is None else timeout_s
        done: concurrent.futures.Future[object] = concurrent.futures.Future()
        self._calls.put((fn, done))
        try:
            return done.result(timeout=bound)  # type: ignore[return-value]
        except concurrent.futures.TimeoutError:
            done.cancel()
            raise StoreUnreachable(
                f"the rendezvous store did not answer within {bound:g} s"
            ) from None

    def submit(self, fn: Callable[[dist.Store], object]) -> None:
        """Run ``fn`` whenever the store answers again, without waiting for it."""
        self._calls.put((fn, concurrent.futures.Future()))

    def close(self) -> None:
        self._calls.put(None)

    def _loop(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, done = item
            if not done.set_running_or_notify_cancel():
                continue  # its caller gave up before it started
            try:
                done.set_result(fn(self._store))
            except BaseException as exc:
                done.set_exception(exc)


class Liveness:
    """This rank's heartbeat and progress in ``store`` (a board's prefixed store), and a reading
    of every peer's when something failed.

    ``progress`` counts the iterations this rank has begun; whoever drives the training loop
    (the hook, or `autotune.ddp.guard.Guard` without it) adds to it. ``peers``: the ranks' processes
    as they said at setup; ``store_host``: the rank whose process serves the store (None: a
    process outside the job, such as torchrun's agent or a launcher).
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        ranks: list[int],
        timeout_s: float,
        peers: Mapping[int, ProcessId],
        store_host: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank = rank
        self.ranks = ranks
        self.timeout_s = timeout_s
        self.period_s = period_for(timeout_s)
        self.peers = dict(peers)
        self.store_host = store_host
        self.clock = clock
        self.progress = 0
        #: When the heartbeat thread last beat, and the longest it has stood still between two
        #: beats beyond its period (`stood_still`).
        self._beat_at = clock()
        self._longest_gap_s = 0.0
        self.bounded = BoundedStore(store, min(STORE_CALL_S, timeout_s))
        self._beat_store = _clone(store)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_loop, name="autotune-beat", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.bounded.close()

    def stood_still(self) -> float | None:
        """Seconds this process stood still (its heartbeat thread did not run), where that was
        longer than the timeout; else None. A process that is stopped (SIGSTOP, a debugger) and
        woken finds its peers gone: they gave up on it, and this says it was the one that hung,
        without the store (whose host may have exited meanwhile)."""
        now = self.clock()
        gap = max(self._longest_gap_s, now - self._beat_at - self.period_s)
        return gap if gap > self.timeout_s else None

    def _beat_loop(self) -> None:
        beat = 0
        while not self._stop.is_set():
            now = self.clock()
            self._longest_gap_s = max(self._longest_gap_s, now - self._beat_at - self.period_s)
            self._beat_at = now
            # The store's host may be gone or stopped: then peers see no beat, as they should.
            with contextlib.suppress(Exception):
                self._beat_store.set(f"live/{self.rank}", f"{beat} {self.progress}")
            beat += 1
            self._stop.wait(self.period_s)

    # -- after a failure ------------------------------------------------------------------

    def suspect(self) -> tuple[int, str] | None:
        """The rank most likely to have failed first, and why; None where nothing points to one.

        In order: a peer on this host whose process exited or is stopped; then, from two readings
        of the store a few heartbeats apart, a peer whose heartbeat stopped, then the peer that
        has begun the fewest iterations. Raises `StoreUnreachable` where the store does not
        answer (the caller decides what that means: see `autotune.comm.faults.FailureBoard`).
        """
        local = self.local_suspect()
        if local is not None:
            return local
        first = self._read()
        wait_s = 2.5 * self.period_s
        time.sleep(wait_s)
        local = self.local_suspect()  # it may have exited meanwhile
        if local is not None:
            return local
        second = self._read()
        others = [r for r in self.ranks if r != self.rank]
        silent = [r for r in others if second.get(r, (-1, 0))[0] == first.get(r, (-1, 0))[0]]
        if silent:
            return silent[0], f"no heartbeat for {wait_s:.1f} s: its process is hung or gone"
        progress = {r: second[r][1] for r in others if r in second}
        progress[self.rank] = self.progress
        furthest = max(progress.values())
        behind = sorted((p, r) for r, p in progress.items() if p < furthest)
        if behind:
            p, r = behind[0]
            return r, f"it had begun {p} iterations where the furthest rank had begun {furthest}"
        return None

    def local_suspect(self) -> tuple[int, str] | None:
        return local_suspect(self.peers, self.rank)

    def _read(self) -> dict[int, tuple[int, int]]:
        others = [r for r in self.ranks if r != self.rank]
        keys = [f"live/{r}" for r in others]

        def read(store: dist.Store) -> list[bytes | None]:
            present = [k for k in keys if store.check([k])]
            values = dict(zip(present, store.multi_get(present), strict=True)) if present else {}
            return [values.get(k) for k in keys]

        out = {}
        for r, raw in zip(others, self.bounded.call(read), strict=True):
            if raw is not None:
                beat, progress = raw.decode().split()
                out[r] = (int(beat), int(progress))
        return out


def local_suspect(peers: Mapping[int, ProcessId], rank: int) -> tuple[int, str] | None:
    """A peer on this host (seen from ``rank``) whose process exited, else one that is stopped;
    the lowest such rank. Other hosts' processes cannot be seen from here."""
    seen = {r: state(p) for r, p in sorted(peers.items()) if p.here}
    exited = [r for r, now in seen.items() if now == "exited"]
    if exited:
        return exited[0], f"its process exited; seen by rank {rank}"
    stopped = [r for r, now in seen.items() if now == "stopped"]
    if stopped:
        return stopped[0], f"its process is stopped (SIGSTOP, a debugger); seen by rank {rank}"
    return None
