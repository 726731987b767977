"""The fault contract where DDP runs without the hook: once autotune unhooked, and in the
check's blocks of plain DDP, a peer that dies or hangs fails ``backward()`` with the same
`PeerError` the hook raises, naming the rank that failed first, within ``Config.timeout_s``.

Three parts. DDP's reducers are rebuilt on a group of autotune's with the job's ranks and
backend and a timeout of ``Config.timeout_s`` (`guarded_group`), so no wait of DDP's outlasts it
(the job's own group may wait 30 minutes, torch's default). An error that ``backward()`` raises
from such a collective is diagnosed as the hook's errors are (`autotune.comm.faults`) and raised as
that `PeerError`: ``backward()`` runs through one wrapper of torch's (`install`), which asks the
live guards about an error and otherwise lets it go as it was. A forward pre-hook counts the
iterations begun without the hook (`autotune.comm.liveness`) and raises the job's failure, once
known, before DDP's forward starts a collective that would wait on a dead peer; where DDP's
forward is the first to fail, a forward hook diagnoses it (the forward raises its own error).
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.autograd
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autotune.algorithms import PeerError, sibling_group
from autotune.comm.groups import backend_name
from autotune.comm.liveness import Liveness

__all__ = ["Guard", "guarded_group", "install"]

_log = logging.getLogger("autotune")

#: Words of the errors torch's backends raise when a collective fails (gloo's transport, NCCL's
#: watchdog, the process group's own). An error in backward() without them is the user's own.
_BACKEND_WORDS = ("gloo", "nccl", "processgroup", "connection", "timed out", "timeout", "peer")


def guarded_group(group: dist.ProcessGroup, timeout_s: float) -> dist.ProcessGroup | None:
    """A group of ``group``'s ranks and backend whose collectives give up after ``timeout_s``,
    for DDP's reducers without the hook; None where the backend is NCCL, whose watchdog bounds
    its own collectives (by the job group's timeout), and a second communicator costs GPU
    memory. Collective: call it on every rank of ``group``."""
    if backend_name(group) != "gloo":
        return None
    return sibling_group(group, "ddp", timedelta(seconds=timeout_s))


class Guard:
    """One state's side of the contract without the hook (module doc).

    ``diagnose(error)``: the job's failure as every rank reports it (the state's, which names
    the culprit and lets peers go); ``hooked(ddp)``: whether autotune's hook is on ``ddp`` now.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        liveness: Callable[[], Liveness | None],
        diagnose: Callable[[BaseException], PeerError],
        hooked: Callable[[DistributedDataParallel], bool],
    ) -> None:
        #: The group DDP's reducers are rebuilt on (None: the job's own, as DDP had it).
        self.group = group
        self._liveness = liveness
        self._diagnose = diagnose
        self._hooked = hooked
        self._model: weakref.ref[DistributedDataParallel] | None = None
        self._handles: list[Any] = []
        #: The job's failure once diagnosed (the same error every later call raises).
        self.failure: PeerError | None = None

    def watch(self, ddp: DistributedDataParallel) -> None:
        """Guard ``ddp`` from now on (idempotent): the forward pre-hook, and ``backward()``."""
        if self._model is not None and self._model() is ddp:
            return
        self._model = weakref.ref(ddp)
        self._handles = [
            ddp.register_forward_pre_hook(self._pre_forward),
            ddp.register_forward_hook(self._after_forward, always_call=True),
        ]
        install(self)

    def adopt_group(self, ddp: DistributedDataParallel) -> None:
        """Before DDP's reducer is first rebuilt without the hook: its collectives go on
        `group` from here on (the same iteration on every rank, as every rebuild is)."""
        if self.group is not None:
            ddp.process_group = self.group

    def _pre_forward(self, module: torch.nn.Module, args: object) -> None:
        if self.failure is not None:
            raise self.failure
        ddp = module
        assert isinstance(ddp, DistributedDataParallel)
        liveness = self._liveness()
        if (
            liveness is not None
            and not self._hooked(ddp)  # the hook counts its own iterations
            and ddp.training
            and torch.is_grad_enabled()
            and ddp.require_backward_grad_sync
        ):
            liveness.progress += 1

    def translate(self, error: BaseException) -> PeerError | None:
        """The `PeerError` that ``error`` (raised by backward()) is, or None: it is one where a
        collective of DDP's failed while this guard's model ran without the hook."""
        if not _from_backend(error):
            return None
        if self.failure is not None:
            return self.failure
        ddp = None if self._model is None else self._model()
        if ddp is None or self._hooked(ddp):
            return None
        self.failure = self._diagnose(error)
        return self.failure

    def _after_forward(self, module: torch.nn.Module, args: object, output: object) -> None:
        """Where DDP's forward failed (its buffers' broadcast, its buckets' rebuild): diagnose
        it now, so the peers learn the culprit and the next call raises the `PeerError`. The
        forward itself raises its own error: a forward hook cannot replace it."""
        error = sys.exc_info()[1]
        if output is not None or error is None or self.failure is not None:
            return  # forward returned (this runs on every forward), or the failure is known
        failure = self.translate(error)
        if failure is not None:
            _log.error("autotune: DDP's forward failed: %s", failure)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        uninstall(self)


def _from_backend(error: BaseException) -> bool:
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(w in text for w in _BACKEND_WORDS)


# -- backward() through the guards --------------------------------------------------------------

_guards: weakref.WeakSet[Guard] = weakref.WeakSet()
_lock = threading.Lock()
#: What torch's ``backward()`` and ``grad()`` call (torch 2.3 and later), by that name. A torch
#: without it gets no wrapper: DDP's errors without the hook then reach the user as they are.
_NAME = "_engine_run_backward"
_torch_run_backward: Callable[..., Any] | None = getattr(torch.autograd, _NAME, None)


def install(guard: Guard) -> None:
    """Route ``backward()`` through `_run_backward` while any guard lives (idempotent).

    torch's ``backward()`` and ``grad()`` both call ``torch.autograd._engine_run_backward``; the
    wrapper adds one Python frame to a backward pass and acts only on an error."""
    with _lock:
        _guards.add(guard)
        if _torch_run_backward is not None:
            setattr(torch.autograd, _NAME, _run_backward)


def uninstall(guard: Guard) -> None:
    with _lock:
        _guards.discard(guard)
        if not _guards and getattr(torch.autograd, _NAME) is _run_backward:
            setattr(torch.autograd, _NAME, _torch_run_backward)


def _run_backward(*args: Any, **kwargs: Any) -> Any:
    assert _torch_run_backward is not None  # installed only where torch has it
    try:
        return _torch_run_backward(*args, **kwargs)
    except PeerError:
        raise
    except Exception as exc:
        for guard in list(_guards):
            failure = guard.translate(exc)
            if failure is not None:
                raise failure from exc
        raise
