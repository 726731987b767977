"""The DDP communication hook: every gradient bucket through autotune's engine, and `register`,
which builds a state over a DDP model's group and registers the hook with it.

No ``from __future__ import annotations`` in this module: DDP's ``register_comm_hook`` compares the
hook's annotations with ``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` as objects,
and string annotations would fail that check.

Example::

    >>> ddp_model.register_comm_hook(autotune.AutotuneState(), autotune.hook)
    >>> state = autotune.register(ddp_model)  # the same, with the model's process group
"""

import contextlib
import time

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.nn.parallel import DistributedDataParallel

from autotune.config import Config
from autotune.state import (
    AutotuneState,
    built_default_state,
    default_state,
    is_default_state,
    reset_default_state,
)
from autotune.storage import describe_model

__all__ = [
    "AutotuneState",
    "check_hookable",
    "default_state",
    "hook",
    "is_default_state",
    "register",
    "reset_default_state",
]


def _check_at_backward_end(future: torch.futures.Future[torch.Tensor]) -> None:
    """Have backward() raise the engine's error itself, as the `PeerError` it is.

    DDP turns an error set on a hook's future into "Unable to cast ... to Tensor"; an autograd
    final callback that raises reaches backward()'s caller with its type. Queued at the last
    bucket's hook call, it runs before DDP's own finalizer (queued after it) and waits on the
    last bucket, which the engine fails after any earlier failure.
    """

    def check() -> None:
        future.wait()

    # Outside backward (a direct call) there is nothing to queue: the future carries the error.
    with contextlib.suppress(RuntimeError):
        torch.autograd.Variable._execution_engine.queue_callback(check)


def hook(
    state: AutotuneState | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """All-reduce (average) one gradient bucket with autotune's engine; return at once.

    Hands the bucket to the engine's worker (which averages it: scales by 1/world size, then
    sums) and returns a pending Future, so backward keeps computing while the bucket travels.
    ``state`` None uses the default state, configured from ``AUTOTUNE_*`` variables, which
    `default_state` must have built before the first backward: building it here would create
    process groups and open the tuning storage in the middle of a step.

    Example::

        >>> ddp_model.register_comm_hook(autotune.AutotuneState(), autotune.hook)
    """
    start = time.perf_counter()
    if state is None:
        state = built_default_state()
    buffer = bucket.buffer()
    if state._cores_warning is not None:
        state._warn_cores(buffer)
    future = state.engine.submit(buffer, bucket.is_last())
    if bucket.is_last():
        liveness = state.board.liveness
        if liveness is not None:
            liveness.progress += 1  # an iteration begun (autotune.comm.liveness)
        _check_at_backward_end(future)
        if state.unhooking is not None:
            state.unhooking.check(state.engine.submitted)
    # The hook's own cost: an iteration's last message that the engine ran here is recorded
    # with the messages.
    state.recorder.add_hook_call(start, time.perf_counter() - start - state.engine.ran_here_s)
    return future


def register(
    ddp_model: DistributedDataParallel,
    config: Config | None = None,
    process_group: ProcessGroup | None = None,
) -> AutotuneState:
    """Build a state over ``ddp_model``'s process group and register `hook` with it.

    DDP allows one comm hook per model: a model that has one already is refused (`check_hookable`).
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(
            "autotune.register takes the DistributedDataParallel model, got a "
            f"{type(ddp_model).__name__}: wrap it first (ddp_model = "
            "torch.nn.parallel.DistributedDataParallel(model)), then register ddp_model"
        )
    check_hookable(ddp_model)
    group = process_group if process_group is not None else ddp_model.process_group
    state = AutotuneState(group, config)
    try:
        ddp_model.register_comm_hook(state, hook)
    except BaseException:
        state.close()
        raise
    if state.unhooking is not None:
        state.unhooking.attach(ddp_model)
    if state.tuner is not None:
        state.tuner.described = describe_model(ddp_model.module)
    return state


def check_hookable(ddp_model: DistributedDataParallel) -> None:
    """Refuse, saying why, a DDP model whose comm hook autotune could not be: one that has a hook
    already (DDP allows one), or one on DDP's Python reducer (compiled autograd), which calls
    hooks per parameter with a tuple and drops what they return."""
    if getattr(ddp_model, "_use_python_reducer", False):
        raise RuntimeError(
            "autotune needs DDP's C++ reducer, which hands comm hooks whole gradient buckets; "
            "with torch._dynamo.config.optimize_ddp='python_reducer' (compiled autograd) DDP "
            "calls hooks per parameter and ignores their result. Use optimize_ddp=True (the "
            "default: torch.compile splits the graph at DDP's buckets), or no comm hook"
        )
    hooks = getattr(ddp_model, "_comm_hooks", [])
    if any(fn is hook for fn, _ in hooks):
        raise RuntimeError(
            "autotune is registered on this DDP model already: register it once per model "
            "(the state the first registration returned is the model's)"
        )
    if hooks:
        names = ", ".join(getattr(h, "__qualname__", repr(h)) for h, _ in hooks)
        raise RuntimeError(
            f"this DDP model has a comm hook already ({names}) and DDP allows one: register "
            "autotune instead of it, not beside it"
        )
