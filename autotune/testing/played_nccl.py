"""A played NCCL for the suite: a process group that keeps NCCL's semantics where autotune relies
on them, on CPU tensors, over gloo, and fails the job where the real one would hang.

CI has no GPU, and the GPU machines are lent rarely and briefly; what the suite cannot run on
NCCL it must play as strictly as NCCL behaves. Each rule below is read from the source of
PyTorch 2.11 (torch/distributed/distributed_c10d.py, torch/csrc/distributed/c10d/
ProcessGroupNCCL.cpp) and NCCL 2.28/2.30 (src/enqueue.cc, docs "Using multiple NCCL
communicators concurrently"):

- **A coalesced batch returns one Work.** ``dist.batch_isend_irecv`` on a NCCL group takes
  its "NCCL style coalescing" branch (``type(group) is ProcessGroup and
  group._get_backend(device).supports_coalescing``): the batch runs as one NCCL group inside
  ``_coalescing_manager`` and the call returns ``cm.works``, one Work for the whole batch. A
  Python process group never takes that branch, so `install` wraps ``batch_isend_irecv`` for
  played groups: one `PlayedWork` covers every operation of the batch.
- **wait(timeout) blocks the host.** ``WorkNCCL::wait`` with a timeout polls ``isCompleted``
  every millisecond (``kSynchronizeBusyWaitMillis``) until the work is done or the timeout
  passes, then throws ("Work ran for ... milliseconds before timing out."). `PlayedWork.wait`
  does the same, against the inner gloo work.
- **One order of launches on every rank.** NCCL's kernels wait for their peers: two ranks
  launching the same communicator's operations in different orders, or interleaving two
  communicators' launches differently, hang (NCCL's guide: issue them "in the same order on
  all ranks", otherwise "deadlocks could ensue"; NVIDIA/nccl#195). gloo, which carries the
  data here, would not hang, so every launch is checked instead: for each pair of ranks, the
  sequence of launches that concern both (a collective on a communicator they share; a
  point-to-point batch between them) must be the same on both. Where it differs the
  operation that sees it raises `OrderError` with both ranks' sequences, and so does every
  later launch and wait (the job fails, as it would hang on a GPU).
- **Stream order is played as host order.** On CUDA an all-reduce's future is complete at
  launch and what follows on the stream waits for the data. A CPU tensor has no stream: a
  future complete before the data would let DDP's reducer read a bucket not yet reduced. So
  a played future completes when the data is there, and ``wait()`` without a timeout blocks
  (``WorkNCCL::wait`` makes the current stream wait instead).
- **A launch does not fail for a dead peer; its operation does.** NCCL enqueues a send or
  receive whatever became of the peer, and the failure comes back on the Work. gloo, which
  carries the data, fails a send or receive at once where its connection to the peer has
  already closed, and whether it has by then is a race: the played launch goes through and
  its Work fails with gloo's error, the same either way.
- **A failed operation ends the process**, after the watchdog's wait, and a timed-out wait
  aborts its communicator: played by `autotune.testing.played_nccl_faults`, which says how.

Launches can be jittered (``jitter_s``: a random sleep before each, seeded per rank), so that
races between a rank's threads resolve differently on different ranks, as timing does on a
GPU machine: what the order check exists to catch.

Use it through `autotune.comm.launch` (``setup=install``, ``backend=BACKEND``)::

    >>> launch(fn, 2, backend=played_nccl.BACKEND, setup=played_nccl.install)

autotune treats the group as NCCL (`autotune.comm.groups.STAND_INS`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
)

from autotune.comm.groups import connection_failed
from autotune.testing.played_nccl_faults import (
    DUMP_WAIT_ENV,
    ERROR_HANDLING_ENV,
    Aborts,
    TimedOut,
    Watchdog,
)
from autotune.testing.played_nccl_order import JITTER_ENV, POLL_S, Launch, Order, OrderError

__all__ = [
    "BACKEND",
    "DUMP_WAIT_ENV",
    "ERROR_HANDLING_ENV",
    "JITTER_ENV",
    "Launch",
    "OrderError",
    "PlayedGroup",
    "PlayedWork",
    "ends_at",
    "final_check",
    "install",
    "launches",
]

#: The backend's name for ``init_process_group`` and ``new_group``.
BACKEND = "played_nccl"

_ABORTS = Aborts()
_ORDER = Order(_ABORTS.refuse)

_WATCHDOG = Watchdog()


def ends_at() -> float | None:
    """When the played watchdog ends this process (`time.monotonic`), or None: no failure yet,
    or ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` says it lives on."""
    return _WATCHDOG.ends_at


def launches() -> list[Launch]:
    """This process's launches on played communicators, in order (for tests)."""
    with _ORDER.lock:
        return list(_ORDER.log)


class PlayedWork(dist.Work):
    """One NCCL Work: an operation, or a whole coalesced batch, carried by gloo's works."""

    def __init__(self, inner: list[dist.Work], what: str, group: PlayedGroup) -> None:
        super().__init__()
        self._inner = inner
        self._what = what
        self._group = group
        self._began = time.monotonic()
        self._waited = 0  # the inner works waited for so far, in order
        self._error: RuntimeError | None = None  # a timed wait ran out: the work stays failed
        for w in inner:  # NCCL's watchdog polls every work from its launch
            if isinstance(w, _Failed):
                _WATCHDOG.failed(what, w.error)

    def is_completed(self) -> bool:
        return self._waited == len(self._inner) or all(w.is_completed() for w in self._inner)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until every operation is done (the host plays the stream); with a timeout,
        raise once it has passed, as ``WorkNCCL::wait`` does. (gloo's point-to-point works
        complete only when waited for, so they are waited on, with what is left of the
        timeout, rather than polled.)"""
        _ORDER.check()
        if self._error is not None:
            raise self._error
        try:
            self._wait(timeout)
            # Without a timeout, a wait on an aborted communicator runs out at the group's.
            wait_s = timeout.total_seconds() if timeout else self._group.timeout_s
            _ABORTS.check(self._group.comm, self._began, wait_s, timeout)
        except TimedOut as exc:
            # WorkNCCL::synchronizeInternal: the communicator is aborted, the work keeps its
            # exception, and the watchdog will end the process.
            self._error = exc
            _ABORTS.abort(self._group.comm)
            _WATCHDOG.failed(self._what, exc)
            raise
        except RuntimeError as exc:
            _WATCHDOG.failed(self._what, exc)
            # A peer that saw the launches diverge has failed and gone, and gloo says only that
            # its connection closed: the divergence is the job's failure, where there is one.
            _ORDER.check(wait_s=2.0)
            raise
        _ORDER.check()
        return True

    def _wait(self, timeout: timedelta) -> None:
        deadline = time.monotonic() + timeout.total_seconds() if timeout else None
        while self._waited < len(self._inner):  # a work done stays done (gloo's would block)
            w = self._inner[self._waited]
            if deadline is None:
                w.wait()
                self._waited += 1
                continue
            try:
                w.wait(timedelta(seconds=max(deadline - time.monotonic(), POLL_S)))
            except RuntimeError as exc:
                if time.monotonic() < deadline - 0.05:  # gloo's clock may end it a bit early
                    raise  # a failure, not the timeout
                ran = (time.monotonic() - self._began) * 1000
                raise TimedOut(
                    f"[played NCCL] {self._what}: Work ran for {ran:.0f} milliseconds before "
                    f"timing out (wait timeout {timeout})."
                ) from exc
            self._waited += 1

    def get_future(self) -> torch.futures.Future[Any]:
        """Complete once the data is there (see the module's last rule), with the operation's
        tensors; for a batch, once every operation is."""
        futures = [w.get_future() for w in self._inner]
        for future in futures:  # the watchdog sees a work fail whoever waits on it
            future.add_done_callback(self._watch)
        whole = futures[0]
        if len(futures) > 1:
            whole = torch.futures.collect_all(futures).then(
                lambda f: [x.value() for x in f.value()]
            )
        # NCCL's watchdog watches every work from its launch, so it knows of a failure before
        # anyone waiting on the work can act on it (a waiter woken beside a done-callback could
        # reach destroy_process_group before the callback told the watchdog).
        return whole.then(self._watch)

    def _watch(self, future: torch.futures.Future[Any]) -> Any:
        try:
            return future.value()
        except Exception as exc:
            _WATCHDOG.failed(self._what, exc)
            raise


class _Failed(dist.Work):
    """An operation gloo failed as it was posted, played as NCCL's: launched, then failed."""

    def __init__(self, error: RuntimeError) -> None:
        super().__init__()
        self.error = error

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        raise self.error

    def get_future(self) -> torch.futures.Future[Any]:
        future: torch.futures.Future[Any] = torch.futures.Future()
        future.set_exception(self.error)
        return future


def _carried(post: Callable[[], dist.Work]) -> dist.Work:
    """gloo's work for a send or receive ``post`` posts, or a failed one where gloo fails it at
    once (its connection to the peer closed: the peer died). NCCL's launch does not fail for a
    peer that is gone; the operation does, and the watchdog sees it (`PlayedWork`). A bad
    argument still fails the launch, as on NCCL."""
    try:
        return post()
    except RuntimeError as exc:
        if not connection_failed(exc):
            raise
        return _Failed(exc)


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class PlayedGroup(dist.ProcessGroup):
    """A NCCL communicator, played: each operation checked for order and carried by gloo."""

    def __init__(self, options: Any, _backend_options: Any = None) -> None:
        super().__init__(options.group_rank, options.group_size)  # type: ignore[call-arg]
        self._inner: Any = dist.ProcessGroupGloo(
            options.store, options.group_rank, options.group_size, options.timeout
        )
        self.comm = str(options.group_id)
        #: Its timeout (``init_process_group``'s or ``new_group``'s), for waits without one.
        self.timeout_s: float = options.timeout.total_seconds()
        # Global ranks (torch leaves the list empty for the default group: all of them).
        members = [int(r) for r in options.global_ranks_in_group]
        self.members = members or list(range(options.group_size))
        #: Inside a played ``batch_isend_irecv``: its operations' works and launches, to be
        #: launched as one.
        self._batch: tuple[list[dist.Work], list[tuple[int, int]], list[tuple[int, int]]] | None
        self._batch = None

    def getBackendName(self) -> str:  # PyProcessGroup's names for what C++ asks
        return BACKEND

    def getGroupName(self) -> str:
        return self.comm

    @property
    def group_name(self) -> str:  # type: ignore[override]
        """The group's name (torch stores it on the C++ backends a Python group lacks)."""
        return self.comm

    def _launched(self, op: str, tensors: Sequence[torch.Tensor], work: dist.Work) -> PlayedWork:
        what = f"{op} of {_nbytes(tensors)} bytes on {self.comm}"
        return PlayedWork([work], what, self)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        _ORDER.launch(self.comm, self.members, "all_reduce", _nbytes(tensors))
        work = self._inner.allreduce(tensors, opts if opts is not None else AllreduceOptions())
        return self._launched("all_reduce", tensors, work)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        _ORDER.launch(self.comm, self.members, "broadcast", _nbytes(tensors))
        work = self._inner.broadcast(tensors, opts if opts is not None else BroadcastOptions())
        return self._launched("broadcast", tensors, work)

    def allgather(  # type: ignore[override]
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        _ORDER.launch(self.comm, self.members, "all_gather", _nbytes(inputs))
        work = self._inner.allgather(outputs, inputs, opts or AllgatherOptions())
        return self._launched("all_gather", inputs, work)

    def barrier(self, opts: Any = None) -> dist.Work:
        _ORDER.launch(self.comm, self.members, "barrier")
        work = self._inner.barrier(opts if opts is not None else BarrierOptions())
        return PlayedWork([work], f"barrier on {self.comm}", self)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        work = _carried(lambda: self._inner.send(tensors, dst, tag))
        return self._p2p(work, sends=[(dst, _nbytes(tensors))])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        work = _carried(lambda: self._inner.recv(tensors, src, tag))
        return self._p2p(work, recvs=[(src, _nbytes(tensors))])

    def _p2p(
        self,
        work: dist.Work,
        sends: list[tuple[int, int]] = (),  # type: ignore[assignment]
        recvs: list[tuple[int, int]] = (),  # type: ignore[assignment]
    ) -> dist.Work:
        # Peers as global ranks: what the check compares across ranks.
        sends = [(self.members[p], n) for p, n in sends]
        recvs = [(self.members[p], n) for p, n in recvs]
        if self._batch is not None:
            works, batch_sends, batch_recvs = self._batch
            works.append(work)
            batch_sends.extend(sends)
            batch_recvs.extend(recvs)
            return work
        # A lone send or receive is a launch of its own (ncclSend/ncclRecv outside a group).
        # gloo posts it before the check: its peer's matching operation may wait for it.
        _ORDER.launch(self.comm, self.members, "p2p", 0, tuple(sends), tuple(recvs))
        return PlayedWork([work], f"point-to-point on {self.comm}", self)

    def batch(self, run: Callable[[], None]) -> PlayedWork:
        """Run ``run`` (which posts sends and receives on this group) as one coalesced launch."""
        assert self._batch is None, "played NCCL: batches do not nest"
        self._batch = ([], [], [])
        try:
            run()
            works, sends, recvs = self._batch
        finally:
            self._batch = None
        _ORDER.launch(self.comm, self.members, "p2p", 0, tuple(sends), tuple(recvs))
        return PlayedWork(
            works, f"batch of {len(works)} point-to-point operations on {self.comm}", self
        )


_original_batch = dist.batch_isend_irecv
_original_destroy = dist.destroy_process_group


def _batch_isend_irecv(p2p_op_list: list[dist.P2POp]) -> list[dist.Work]:
    """``dist.batch_isend_irecv`` as on NCCL for a played group: one Work for the batch."""
    group = p2p_op_list[0].group if p2p_op_list else None
    if group is None:
        group = dist.group.WORLD
    if not isinstance(group, PlayedGroup):
        return _original_batch(p2p_op_list)

    def post() -> None:
        for op in p2p_op_list:
            key = "group_dst" if op.op is dist.isend else "group_src"
            op.op(op.tensor, group=op.group, tag=op.tag, **{key: op.group_peer})

    return [group.batch(post)]


def _destroy_process_group(group: Any = None) -> None:
    """``dist.destroy_process_group``, which waits for a doomed process's watchdog."""
    _WATCHDOG.hold()
    _original_destroy(group)


def _create(options: Any, backend_options: Any) -> PlayedGroup:
    return PlayedGroup(options, backend_options)


def install() -> None:
    """Register the played NCCL (``BACKEND``) in this process; call it before
    ``init_process_group`` (``autotune.comm.launch``'s ``setup``)."""
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    dist.batch_isend_irecv = _batch_isend_irecv
    dist.destroy_process_group = _destroy_process_group
    rank = int(os.environ.get("RANK", "0"))
    _ORDER.reset(_store(), rank)
    _ABORTS.reset(_ORDER.store, rank)


def _store() -> dist.Store:
    """The launcher's store (every rank's environment names it)."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )


def final_check(wait_s: float = 10.0) -> None:
    """Wait up to ``wait_s`` for the peers' launches still unseen and compare them: call it at
    the end of a job on the played NCCL, so no divergence goes unseen (elsewhere: nothing)."""
    if _ORDER.store is not None:
        _ORDER.check(wait_s)
