"""DDP's reducer, rebuilt: the primitives autotune unhooks with and tunes DDP's bucket size by.

DDP keeps a comm hook for good, so `rebuild_reducer` builds the model a new reducer, by the
sequence ``DistributedDataParallel.__setstate__`` runs after unpickling: it has no hook,
re-learns its buckets from the backward order, and the job runs as plain DDP from there
(`autotune.tuning.unhooked` decides when). `set_bucket_cap` sets the cap its next reducer
buckets by, `saved_bucket_config` / `restore_bucket_config` keep and put back the job's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch.nn.parallel import DistributedDataParallel

__all__ = [
    "rebuild_reducer",
    "restore_bucket_config",
    "saved_bucket_config",
    "set_bucket_cap",
    "why_not_rebuilt",
]

#: DDP's private methods the rebuild runs, as its ``__setstate__`` does (torch 2.6 to 2.13).
_NEEDS = ("_build_params_for_reducer", "_build_debug_param_to_name_mapping", "_ddp_init_helper")


def why_not_rebuilt(
    ddp: DistributedDataParallel, ours: Callable[[object, object], bool]
) -> str | None:
    """Why `rebuild_reducer` must not run on ``ddp``, or None. ``ours(hook, state)``: whether a
    comm hook DDP holds is autotune's."""
    missing = [name for name in _NEEDS if not hasattr(ddp, name)]
    if missing:
        return f"this torch's DistributedDataParallel has no {', '.join(missing)}"
    # DDP's mixed_precision holds a comm hook of its own, and its Python reducer never reaches
    # autotune's with buckets (`autotune.hook.check_hookable`): neither gets here.
    hooks = getattr(ddp, "_comm_hooks", None)
    if not hooks or len(hooks) != 1 or not ours(*hooks[0]):
        return "the model's comm hooks are not autotune's alone"
    return None


def rebuild_reducer(ddp: DistributedDataParallel) -> None:
    """Give ``ddp`` a new reducer, with no comm hook, as ``DistributedDataParallel.__setstate__``
    builds one. Call it between iterations (no backward running). If the build fails, the old
    reducer, its hook and its logger stay as they were, and the error is raised."""
    old_reducer, old_logger = ddp.reducer, ddp.logger
    parameters, expect_sparse = ddp._build_params_for_reducer()
    names = ddp._build_debug_param_to_name_mapping(parameters)
    try:
        ddp._ddp_init_helper(parameters, expect_sparse, names, ddp.static_graph)
        if ddp.static_graph:
            ddp.reducer._set_static_graph()
            assert ddp.logger is not None
            ddp.logger._set_static_graph()
            # A static graph's first iteration all-reduces at backward's end, from a callback
            # queued only while this is False; the old reducer's first iteration set it.
            ddp._static_graph_delay_allreduce_enqueued = False
    except BaseException:
        new = ddp.reducer
        if new is not old_reducer:
            # Its autograd hooks are on the parameters already: a second reducer would
            # all-reduce every gradient again.
            new._remove_autograd_hooks()
        ddp.reducer, ddp.logger = old_reducer, old_logger
        raise
    ddp._has_rebuilt_buckets = False
    ddp._comm_hooks = []
    # Now, not when the old reducer is freed: until then its hooks would still reduce.
    old_reducer._remove_autograd_hooks()


#: DDP's attributes that say how its next reducer buckets (torch 2.13; earlier ones lack the
#: first, and ``bucket_bytes_cap_default`` says whether the first bucket is DDP's 1 MiB).
_CONFIG = ("_bucket_config", "bucket_bytes_cap", "bucket_bytes_cap_default")


def saved_bucket_config(ddp: DistributedDataParallel) -> dict[str, Any]:
    return {name: getattr(ddp, name) for name in _CONFIG if hasattr(ddp, name)}


def restore_bucket_config(ddp: DistributedDataParallel, saved: dict[str, Any]) -> None:
    for name, value in saved.items():
        setattr(ddp, name, value)


def set_bucket_cap(ddp: DistributedDataParallel, nbytes: int) -> None:
    """Have ``ddp``'s next reducer (`rebuild_reducer`) bucket its gradients up to ``nbytes``, as
    ``bucket_cap_mb=nbytes / 2**20`` would have: every bucket, the first included, up to it.
    (torch 2.13 keeps the sizes in ``_bucket_config``; earlier ones in the attributes.)"""
    config = getattr(ddp, "_bucket_config", None)
    if config is not None:
        ddp._bucket_config = dataclasses.replace(
            config,
            bucket_bytes_cap=nbytes,
            per_bucket_bytes_caps=(),
            first_bucket_bytes_cap=nbytes,
        )
    ddp.bucket_bytes_cap = nbytes
    ddp.bucket_bytes_cap_default = False
