"""Point-to-point steps shared by every algorithm: post receives and sends, reduce a segment.

An algorithm describes itself as a sequence of rounds of `Send` and `Recv` over ranges of one flat
buffer; `Transport` posts them on a dedicated process group and overlaps each round's transfers with
the reductions of the round before, waiting only where a range is about to be read or overwritten.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from autotune.comm.groups import Comm

__all__ = ["Recv", "Round", "ScratchPool", "Send", "Transport", "segments", "split"]


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``buf[start:stop]`` to group rank ``peer``."""

    peer: int
    start: int
    stop: int
    channel: int = 0


@dataclass(frozen=True, slots=True)
class Recv:
    """Receive ``buf[start:stop]`` from group rank ``peer``: added into the range, or over it."""

    peer: int
    start: int
    stop: int
    reduce: bool = True
    channel: int = 0


def split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    """Cut ``[start, stop)`` into ``parts`` contiguous ranges whose lengths differ by at most 1."""
    n = stop - start
    return [(start + i * n // parts, start + (i + 1) * n // parts) for i in range(parts)]


def segments(start: int, stop: int, segment_elems: int) -> list[tuple[int, int]]:
    """Cut ``[start, stop)`` into pipeline segments of ``segment_elems`` (the last may be short)."""
    return [(a, min(a + segment_elems, stop)) for a in range(start, stop, segment_elems)]


#: One round of an algorithm: what this rank sends, and what it receives.
Round = tuple[Sequence[Send], Sequence[Recv]]


@dataclass(slots=True, eq=False)
class _Pending:
    work: dist.Work
    recv: Recv
    round: int
    scratch: torch.Tensor | None  # where the data lands when not straight in place


@dataclass(slots=True, eq=False)
class _InFlight:
    work: dist.Work
    send: Send
    round: int


def _overlaps(a_start: int, a_stop: int, b_start: int, b_stop: int) -> bool:
    return a_start < b_stop and b_start < a_stop


class ScratchPool:
    """Receive buffers kept between all-reduces, so the steady state allocates nothing.

    CPU only: a fresh multi-MiB host buffer is fresh pages, and faulting them in costs as much as
    the transfer. CUDA keeps using its caching allocator, which knows about streams.
    """

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._free: dict[tuple[torch.dtype, int], list[torch.Tensor]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, like: torch.Tensor) -> torch.Tensor:
        if like.device.type != "cpu":
            return torch.empty_like(like)
        with self._lock:
            free = self._free.get((like.dtype, like.numel()))
            if free:
                t = free.pop()
                self._bytes -= t.numel() * t.element_size()
                return t
        return torch.empty_like(like)

    def give(self, t: torch.Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        if t.device.type != "cpu":
            return
        with self._lock:
            if self._bytes + nbytes <= self.max_bytes:
                self._free.setdefault((t.dtype, t.numel()), []).append(t)
                self._bytes += nbytes


#: Receives at least this large wait for earlier sends of their range and land in place; smaller
#: ones land in scratch instead of waiting (see `Transport._post`).
INPLACE_MIN_BYTES = 256 << 10

#: The pool a `Transport` uses unless it is given one.
DEFAULT_SCRATCH = ScratchPool()


class Transport:
    """Run an algorithm's rounds over one flat buffer as a dataflow: wait only where data is needed.

    On gloo, each round's sends are posted, then the receives of up to ``window`` later rounds, so
    data can leave the moment it is ready (gloo otherwise spends a round trip telling a sender its
    receiver is ready). A send first applies the pending receives that write its range; other
    receives are applied ``lag`` rounds late, when their data has most likely arrived. A receive
    lands in scratch, to be added or copied in when applied, if it reduces, if a send of its own
    round reads its range, or if an earlier receive still writes it; a receive that would land on
    a range a later round's send reads is held back until that send is out. Otherwise it lands in
    place: a large one after waiting for earlier sends of the range, a small one via scratch when
    such a send is still in flight (see `INPLACE_MIN_BYTES`). So an algorithm states only what
    moves where, and gets pipelining without hazards.

    On NCCL each round is one `batch_isend_irecv` group, and waits order the current stream.
    Operations between a pair of ranks in one direction are matched in posting order (NCCL has no
    tags), so each batch's operations are sorted by (peer, channel, range) on both sides.
    """

    def __init__(
        self,
        buf: torch.Tensor,
        comm: Comm,
        *,
        window: int = 1,
        lag: int = 4,
        scratch: ScratchPool = DEFAULT_SCRATCH,
    ) -> None:
        assert buf.dim() == 1 and buf.is_contiguous()
        assert window >= 1 and lag >= 1
        self.buf = buf
        self.comm = comm
        self.scratch = scratch
        self._batched = comm.backend == "nccl"
        # NCCL runs each batch as one group on one stream: a batch holding round t's sends and a
        # later round's receives would wait on the peer's next batch, which waits on this one. On
        # gloo a window of at least one is needed: a blocking wait on a send is only safe once
        # every peer has posted the receives of the rounds before.
        self.window = 0 if self._batched else window
        self.lag = lag
        self._pending: list[_Pending] = []
        self._sends: list[_InFlight] = []

    def run(self, rounds: Sequence[Round]) -> None:
        """Run ``rounds`` in order; on return the buffer holds the result and every send is done."""
        if self._batched:
            for t, (sends, recvs) in enumerate(rounds):
                for s in sends:
                    self._settle(s.start, s.stop, before=t)
                self._post(t, sends, recvs, sends)
                self._retire(t - self.lag)
        else:
            self._run_ahead(rounds)
        self._retire(len(rounds))

    def _run_ahead(self, rounds: Sequence[Round]) -> None:
        posted = 0  # rounds whose receives are posted
        for t, (sends, _) in enumerate(rounds):
            if posted == t:  # at the latest, a round's receives go out before its sends
                self._post(t, (), rounds[t][1], sends)
                posted += 1
            for s in sends:
                self._settle(s.start, s.stop, before=t)
            self._post(t, sends, (), ())
            # Now that this round's sends are queued, post later rounds' receives. Waiting there
            # for an old send to free a range costs nothing: the link has the next one to carry.
            while posted < len(rounds) and posted <= t + self.window:
                upcoming = [s for r in rounds[t + 1 : posted + 1] for s in r[0]]
                if _lands_on(rounds[posted][1], upcoming):
                    break  # post it once those sends are out, and land it in place then
                self._post(posted, (), rounds[posted][1], upcoming)
                posted += 1
            self._retire(t - self.lag)

    def _post(
        self, t: int, sends: Sequence[Send], recvs: Sequence[Recv], upcoming: Sequence[Send]
    ) -> None:
        """Post, as one batch, round ``t``'s ``sends`` and ``recvs``.

        ``upcoming``: sends not posted yet that come before ``recvs``' round ends; a receive whose
        range one of them reads must not land in place.
        """
        sends = sorted(sends, key=_order)
        recvs = sorted(recvs, key=_order)
        landing: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for r in recvs:
            assert 0 <= r.start < r.stop <= self.buf.numel(), r
            target = self.buf[r.start : r.stop]
            scratch = None
            nbytes = target.numel() * target.element_size()
            if r.reduce or self._busy(r.start, r.stop, upcoming):
                scratch = self.scratch.take(target)
            elif nbytes < INPLACE_MIN_BYTES and self._reading(r.start, r.stop):
                # A small copy costs microseconds; waiting on a send that may still be waiting
                # for its receiver's ready notice can cost a scheduler time slice.
                scratch = self.scratch.take(target)
            else:
                # A large range: the link already carries the next send, so waiting for the old
                # one to finish costs nothing, and saves copying the range a second time.
                self._drain_sends(r.start, r.stop)
            landing.append((target if scratch is None else scratch, scratch))
        for s in sends:
            assert 0 <= s.start < s.stop <= self.buf.numel(), s
        sources = [self.buf[s.start : s.stop] for s in sends]
        works = self.comm.posted(
            lambda: self._launch(landing, recvs, sources, sends), f"round {t}'s sends and receives"
        )
        n = len(recvs)
        self._pending.extend(
            _Pending(w, r, t, scratch)
            for w, r, (_, scratch) in zip(works[:n], recvs, landing, strict=True)
        )
        self._sends.extend(_InFlight(w, s, t) for w, s in zip(works[n:], sends, strict=True))
        self.comm.traffic.bytes_sent += (
            sum(src.numel() for src in sources) * self.buf.element_size()
        )
        self.comm.traffic.messages_sent += len(sources)

    def _launch(
        self,
        landing: Sequence[tuple[torch.Tensor, torch.Tensor | None]],
        recvs: Sequence[Recv],
        sources: Sequence[torch.Tensor],
        sends: Sequence[Send],
    ) -> list[dist.Work]:
        """Launch the receives into ``landing`` and the sends of ``sources``: their works, the
        receives' first."""
        g = self.comm.group
        if self._batched:
            ops = [
                dist.P2POp(dist.irecv, dest, group=g, group_peer=r.peer, tag=r.channel)
                for (dest, _), r in zip(landing, recvs, strict=True)
            ] + [
                dist.P2POp(dist.isend, src, group=g, group_peer=s.peer, tag=s.channel)
                for src, s in zip(sources, sends, strict=True)
            ]
            works = dist.batch_isend_irecv(ops) if ops else []
            if len(works) == 1 and len(ops) > 1:
                # NCCL coalesces the batch into one group and returns one Work for all of it
                # (distributed_c10d.batch_isend_irecv returns the coalescing manager's works);
                # that Work stands for each operation of the batch.
                works = works * len(ops)
            return works
        return [
            _work(dist.irecv(dest, group=g, group_src=r.peer, tag=r.channel))
            for (dest, _), r in zip(landing, recvs, strict=True)
        ] + [
            _work(dist.isend(src, group=g, group_dst=s.peer, tag=s.channel))
            for src, s in zip(sources, sends, strict=True)
        ]

    def _busy(self, start: int, stop: int, upcoming: Sequence[Send]) -> bool:
        """Whether a send yet to be posted will read, or a pending receive write, a range."""
        return any(_overlaps(start, stop, s.start, s.stop) for s in upcoming) or any(
            _overlaps(start, stop, p.recv.start, p.recv.stop) for p in self._pending
        )

    def _reading(self, start: int, stop: int) -> bool:
        """Whether a posted send not yet waited for reads ``[start, stop)``."""
        return any(_overlaps(start, stop, f.send.start, f.send.stop) for f in self._sends)

    def _apply(self, p: _Pending) -> None:
        r = p.recv
        nbytes = (r.stop - r.start) * self.buf.element_size()
        traffic = self.comm.traffic
        start = time.perf_counter()
        self.comm.wait(
            p.work,
            f"receive of {nbytes} bytes from rank {self.comm.global_rank(r.peer)}",
            r.peer,
        )
        waited = time.perf_counter() - start
        traffic.wait_s += waited
        if traffic.first_wait_s is None:
            traffic.first_wait_s = waited
        if p.scratch is not None:
            self._drain_sends(r.start, r.stop)
            target = self.buf[r.start : r.stop]
            if r.reduce:
                target.add_(p.scratch)
            else:
                target.copy_(p.scratch)
            self.scratch.give(p.scratch)

    def _retire(self, t: int) -> None:
        """Apply pending receives and wait for sends of round ``t`` or earlier, in posting order."""
        if self._pending and self._pending[0].round <= t:
            keep: list[_Pending] = []
            for p in self._pending:
                if p.round <= t:
                    self._apply(p)
                else:
                    keep.append(p)
            self._pending = keep
        if self._sends and self._sends[0].round <= t:
            keep_sends: list[_InFlight] = []
            for f in self._sends:
                if f.round <= t:
                    self._wait_send(f)
                else:
                    keep_sends.append(f)
            self._sends = keep_sends

    def _settle(self, start: int, stop: int, *, before: int) -> None:
        """Apply, in posting order, receives of rounds before ``before`` writing ``[start, stop)``.

        Receives of later rounds posted ahead into the range landed in scratch (see `_post`), so
        they cannot disturb what is about to be sent.
        """
        hit: list[_Pending] = []
        keep: list[_Pending] = []
        for p in self._pending:
            due = p.round < before and _overlaps(start, stop, p.recv.start, p.recv.stop)
            (hit if due else keep).append(p)
        if hit:
            self._pending = keep
            for p in hit:
                self._apply(p)

    def _drain_sends(self, start: int, stop: int) -> None:
        """Wait for sends still reading ``[start, stop)``."""
        keep: list[_InFlight] = []
        for f in self._sends:
            if _overlaps(start, stop, f.send.start, f.send.stop):
                self._wait_send(f)
            else:
                keep.append(f)
        self._sends = keep

    def _wait_send(self, f: _InFlight) -> None:
        nbytes = (f.send.stop - f.send.start) * self.buf.element_size()
        peer = self.comm.global_rank(f.send.peer)
        self.comm.wait(f.work, f"send of {nbytes} bytes to rank {peer}", f.send.peer)


def _lands_on(recvs: Sequence[Recv], sends: Sequence[Send]) -> bool:
    """Whether an in-place receive among ``recvs`` overwrites a range one of ``sends`` reads."""
    return any(
        _overlaps(r.start, r.stop, s.start, s.stop) for r in recvs if not r.reduce for s in sends
    )


def _order(op: Send | Recv) -> tuple[int, int, int]:
    return (op.peer, op.channel, op.start)


def _work(work: dist.Work | None) -> dist.Work:
    assert work is not None, "isend/irecv on a group this rank belongs to always returns a Work"
    return work
