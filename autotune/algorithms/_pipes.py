"""A barrier among the ranks of one host through named pipes: a wake-up is a write and a read.

`PipeBarrier` gives `shm` a barrier without gloo's loopback TCP hops (docs/ALGORITHMS.md,
"shm"). Each ordered pair of ranks has a pipe, a FIFO in the window's directory, unlinked once
both its ends are open: at the barrier a rank writes one byte into each peer's pipe and reads one
from each of its own. One byte per pair per barrier, in order, so a peer that runs ahead to the
next barrier leaves its byte queued for it; `exchange` is the barrier with a short record of the
caller's in place of the byte (`shm` says there where each rank's input is). A rank that dies
closes its ends: its pipe then reads empty, a `PeerError` naming it at once rather than after
the timeout.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
import weakref
from datetime import timedelta

from autotune.comm.groups import Comm, PeerError, group_timeout

__all__ = ["PipeBarrier"]

#: How long a barrier waits where neither the algorithm nor the group says: torch's default.
DEFAULT_TIMEOUT = timedelta(minutes=30)


class PipeBarrier:
    """A barrier over the ranks of ``comm`` (all on one host), through pipes made under ``prefix``.

    Made collectively (`open`); `wait` is the barrier; `close` (or garbage collection) closes
    the pipes' ends.
    """

    def __init__(self, reads: dict[int, int], writes: dict[int, int]) -> None:
        # Group rank of each peer -> the file descriptor of our end of the pipe from (to) it.
        self._reads = reads
        self._writes = writes
        fds = [*reads.values(), *writes.values()]
        self._finalizer = weakref.finalize(self, _close_all, fds)

    @classmethod
    def open(cls, comm: Comm, prefix: str) -> PipeBarrier:
        """Make the pipes between every pair of ``comm``'s ranks, named ``prefix-<from>-<to>``,
        open both ends, and unlink them. Collective (the ranks agree through ``comm``'s group).
        Raises `RuntimeError` on every rank where any rank failed."""
        peers = [p for p in range(comm.size) if p != comm.rank]
        reads: dict[int, int] = {}
        writes: dict[int, int] = {}
        mine = [f"{prefix}-{p}-{comm.rank}" for p in peers]
        error: OSError | None = None
        try:
            for peer, path in zip(peers, mine, strict=True):
                os.mkfifo(path, 0o600)
                # Non-blocking: opening a FIFO's read end alone would block until a writer came.
                reads[peer] = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            error = exc
        try:
            if comm.smallest(int(error is None), "making the pipes between the ranks"):
                try:  # every read end is open now, so opening a write end does not fail
                    for peer in peers:
                        path = f"{prefix}-{comm.rank}-{peer}"
                        writes[peer] = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:
                    error = exc
                everyone = comm.smallest(int(error is None), "opening the pipes between the ranks")
            else:
                everyone = 0
        finally:
            for path in mine:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        barrier = cls(reads, writes)
        if not everyone:
            barrier.close()
            why = f": {error}" if error is not None else " on another rank"
            raise RuntimeError(
                f"{comm.algorithm} {comm.collective}: could not make pipes under {prefix}{why}"
            )
        return barrier

    def wait(self, comm: Comm, what: str) -> None:
        """Return once every rank of ``comm`` has called `wait` as often as this rank has.
        Raises `PeerError` where a peer is gone or the timeout passes first: ``comm``'s, else
        its group's, as the gloo barrier this replaced waited."""
        self.exchange(comm, what, b"\0")

    def exchange(self, comm: Comm, what: str, record: bytes) -> dict[int, bytes]:
        """`wait`, sending ``record`` to every peer instead of a byte: each peer's record, by
        group rank. Every rank passes a record of the same length at the same barrier (at most
        `select.PIPE_BUF` bytes, so that it is written whole or not at all)."""
        if not 0 < len(record) <= select.PIPE_BUF:
            raise ValueError(f"a barrier's record is 1 to {select.PIPE_BUF} bytes: {len(record)}")
        for peer, fd in self._writes.items():
            try:
                os.write(fd, record)
            except BrokenPipeError as exc:  # its read end is closed: the peer is gone
                raise _gone(comm, what, peer) from exc
        waiting = dict(zip(self._reads.values(), self._reads, strict=True))  # fd -> peer
        got = {peer: b"" for peer in self._reads}
        poller = select.poll()
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        limit = comm.timeout or group_timeout(comm.group) or DEFAULT_TIMEOUT
        deadline = time.monotonic() + limit.total_seconds()
        while waiting:
            left_ms = max(0, int((deadline - time.monotonic()) * 1e3))
            ready = poller.poll(left_ms)
            if not ready:
                peers = ", ".join(str(comm.global_rank(p)) for p in sorted(waiting.values()))
                raise PeerError(
                    f"{comm.algorithm} {comm.collective}: {what} did not finish within "
                    f"{limit}: rank(s) {peers} never came",
                    algorithm=comm.algorithm,
                    peer=comm.global_rank(min(waiting.values())),
                )
            for fd, _ in ready:
                peer = waiting[fd]
                data = os.read(fd, len(record) - len(got[peer]))
                if not data:  # end of file: every writer (the peer) closed it
                    raise _gone(comm, what, peer)
                got[peer] += data
                if len(got[peer]) == len(record):
                    del waiting[fd]
                    poller.unregister(fd)
        return got

    def close(self) -> None:
        """Close this rank's ends of the pipes (its peers' next `wait` then raises)."""
        self._finalizer()


def _gone(comm: Comm, what: str, peer: int) -> PeerError:
    rank = comm.global_rank(peer)
    return PeerError(
        f"{comm.algorithm} {comm.collective}: {what} failed: rank {rank} closed its pipe "
        "(it exited or died)",
        algorithm=comm.algorithm,
        rank=rank,
        peer=rank,
    )


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
