"""What the tuner hands to DDP once autotune unhooks (`autotune.ddp.unhook`): the search over DDP's
own bucket size and the check of a plan that needs the hook against plain DDP, built for one state.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

from torch.nn.parallel import DistributedDataParallel

from autotune.algorithms import carry
from autotune.config import Config
from autotune.ddp.engine import Engine
from autotune.ddp.guard import Guard
from autotune.ddp.unhook import PlainCheckHooks, Unhooking
from autotune.plan import Table
from autotune.tuning.buckets import MAX_PAIRS, BucketTuner, why_not_tuned
from autotune.tuning.plain_check import PlainCheck
from autotune.tuning.tuner import Tuner

_log = logging.getLogger("autotune")

__all__ = ["bucket_tuner", "catch_hooks", "plan_file_buckets"]


def bucket_tuner(
    tuner: Tuner, config: Config
) -> Callable[[DistributedDataParallel], BucketTuner | None]:
    """Once unhooked: DDP's bucket size tuned, from the fusion size the tuner kept and the size a
    previous job stored, unless the model's buckets cannot be (`autotune.tuning.buckets`)."""

    def start(ddp: DistributedDataParallel) -> BucketTuner | None:
        why = "tuning stopped: its storage failed" if tuner.frozen else why_not_tuned(ddp)
        if why is not None:
            _log.info("autotune leaves DDP's bucket size as the job set it: %s", why)
            return None
        return BucketTuner(
            ddp,
            first=tuner.arm.fusion_bytes or None,
            stored=lambda: tuner.buckets,
            on_done=tuner.buckets_kept,
            max_pairs=min(MAX_PAIRS, config.max_pairs),
        )

    return start


def catch_hooks(tuner: Tuner, engine: Engine, config: Config) -> PlainCheckHooks:
    """The check against plain DDP (`autotune.tuning.plain_check`): the plan the tuner locked,
    against plain DDP."""

    def settle() -> None:
        if not engine.settle(config.timeout_s):
            raise TimeoutError(
                f"autotune: the hook's last iteration was not handled within {config.timeout_s} s"
            )

    def make(ddp: DistributedDataParallel) -> PlainCheck:
        return PlainCheck(
            ddp,
            plan=tuner.arm.describe(),
            settle=settle,
            rehooked=engine.forget_step,
            max_pairs=min(MAX_PAIRS, config.max_pairs),
        )

    return PlainCheckHooks(
        due=lambda: tuner.check_from,
        make=make,
        over=tuner.caught,
        iteration=lambda: engine.iteration,
    )


def plan_file_buckets(
    table: Table,
    ranks: int,
    config: Config,
    ours: Callable[[object, object], bool],
    guard: Guard | None,
) -> Unhooking | None:
    """A plan file that keeps DDP's own all-reduce in buckets of its size: the hook unhooks
    after the first iteration, onto a reducer with that size (or the job's own, where the tuned
    job kept its own), its NCCL cells handed to NCCL's tuner plugin (`autotune.algorithms.
    carry`; ``ranks``: the job's). A table that says so runs every class without the hook:
    autotune stores a size only once it unhooked."""
    buckets = table.buckets
    assert buckets is not None
    if not config.unhook:
        warnings.warn(
            f"the plan file keeps {buckets.describe()}, which autotune applies by unhooking: "
            "with Config.unhook=False the hook runs on DDP's buckets as built",
            stacklevel=4,
        )
        return None
    # No gain: the size is the one the tuned job was built with; this job's own stays.
    size = None if buckets.gain is None else buckets.bucket_bytes
    classes = {cls: e.choice for cls, e in table.classes.items()}
    return Unhooking(
        lambda: 1, ours, bucket_bytes=size, guard=guard, carry=lambda: carry(classes, ranks)
    )
