"""DDP's ``Join`` (uneven inputs), seen from autotune: whether one is open on a model.

Under ``with Join([ddp_model]):`` a rank that runs out of batches joins: it runs no forward, and
shadows the others' collectives from ``Join.__exit__``, one DDP iteration at a time, the
backward's through the model's comm hook (autotune's included: its engine takes the zero buckets
as it takes any). What autotune does from the model's forward pre-hook (`autotune.tuning.unhooked`:
unhooking, the check against plain DDP, DDP's bucket-size search) a joined rank never reaches:
its collectives there (a block's step times, MAX-reduced) would meet the joined rank's
``Join`` collectives instead, and a reducer rebuilt on the others but not on it would shadow the
wrong buckets. So all of it holds while a Join is open, on every rank alike: a Join is built at
the same point of the program on every rank, and its post-hooks run on every rank once every
rank has joined; it goes on at the first forward after.

An unhook that is due is the exception: it is a rebuild of the reducer on each rank, with no
collective of its own, so the ranks still running do it in their pre-hook and a rank that has
joined does it before its shadow of the same iteration (`JoinWatch`'s ``shadow``), on the group
the Join was built with (autotune's own group, `autotune.ddp.guard`, is taken at the first
forward after the Join). A job whose training loop is inside a Join still unhooks.

`JoinWatch` wraps the model's ``join_hook`` (what ``Join`` calls when it is built) so that it
sees each Join built on the model from then on, and its end; and a Join built before the watch
began (a model registered with ``register_comm_hook``, found at its first iteration, inside the
user's Join), found among the live objects, so that its end is seen too.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from torch.distributed.algorithms.join import Join, JoinHook
from torch.nn.parallel import DistributedDataParallel

__all__ = ["JoinWatch"]


class JoinWatch:
    """Whether a ``Join`` is open on ``ddp`` (`open`), from when it is built until its post-hooks
    ran; the same on every rank at the same forward. ``shadow()`` runs on a rank that has joined
    before each of its shadows of the others' iterations (before DDP's own join hook)."""

    def __init__(
        self, ddp: DistributedDataParallel, shadow: Callable[[], None] | None = None
    ) -> None:
        self._ddp = ddp
        self._shadow = shadow
        self._open = False
        # A Join built before this watch began leaves its configuration on the model for good:
        # it is open if it is still alive (its __exit__ runs the hooks it holds, wrapped here).
        if _enabled(ddp):
            for join in [o for o in gc.get_objects() if isinstance(o, Join)]:
                if any(j is ddp for j in join._joinables):
                    join._join_hooks = [
                        _Watched(h, self) if getattr(h, "ddp", None) is ddp else h
                        for h in join._join_hooks
                    ]
                    self._open = True
        self._ddp_join_hook: Callable[..., JoinHook] = ddp.join_hook  # DDP's own, bound
        ddp.join_hook = self._join_hook  # type: ignore[method-assign]

    @property
    def model(self) -> DistributedDataParallel:
        return self._ddp

    @property
    def open(self) -> bool:
        """Whether a Join that detects uneven inputs (``enable=True``) is open on the model."""
        return self._open and _enabled(self._ddp)

    def _join_hook(self, **kwargs: Any) -> JoinHook:
        self._open = True
        return _Watched(self._ddp_join_hook(**kwargs), self)

    def _closed(self) -> None:
        self._open = False

    def close(self) -> None:
        """Give the model its own ``join_hook`` back."""
        if self._ddp.__dict__.get("join_hook") == self._join_hook:
            del self._ddp.join_hook


class _Watched(JoinHook):
    """DDP's join hook, telling the watch when the Join ends."""

    def __init__(self, inner: JoinHook, watch: JoinWatch) -> None:
        self._inner = inner
        self._watch = watch

    def main_hook(self) -> None:
        if self._watch._shadow is not None:
            self._watch._shadow()
        self._inner.main_hook()

    def post_hook(self, is_last_joiner: bool) -> None:
        self._inner.post_hook(is_last_joiner)
        self._watch._closed()


def _enabled(ddp: DistributedDataParallel) -> bool:
    config = getattr(ddp, "_join_config", None)
    return bool(getattr(config, "enable", False))
