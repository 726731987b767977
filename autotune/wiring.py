"""How an `AutotuneState` is put together: NCCL's clock, the engine, the guard, the tuner, the
unhooking and the exporter, each built on every rank at the same point and handed what it uses.

`build` is called inside the state's setup handshake (`autotune.comm.faults.FailureBoard`): a part
that fails on one rank fails construction there, and the handshake names it on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.nn.parallel import DistributedDataParallel

from autotune.algorithms import AllReduceAlgorithm, PeerError, p2p_group
from autotune.comm.groups import backend_name
from autotune.comm.liveness import Liveness
from autotune.comm.nccl_feed import feed
from autotune.config import Config
from autotune.ddp.engine import Engine
from autotune.ddp.events import Listener
from autotune.ddp.guard import Guard, guarded_group
from autotune.ddp.kernel_clock import KernelClock
from autotune.plan import BASELINE_CHOICE, Choice, Plan, Table
from autotune.setup_checks import fusion_bytes_at_start, refuse_what_cannot_run
from autotune.tuning import Tuner
from autotune.tuning.unhooked import Unhooking, bucket_tuner, catch_hooks, plan_file_buckets

if TYPE_CHECKING:
    from autotune.metrics import Exporter

_log = logging.getLogger("autotune")

__all__ = ["Lent", "Parts", "build"]


@dataclass(frozen=True, slots=True)
class Lent:
    """What the state lends its parts: the algorithms by name, its diagnosis of a failure (the
    engine's, and DDP's own without the hook), whether a comm hook a model holds is the state's
    (`autotune.tuning.unhooked.Unhooking`), the ranks' liveness (`autotune.comm.liveness`), and
    who hears the engine's events first."""

    algorithm_for: Callable[[str], AllReduceAlgorithm]
    diagnose: Callable[[BaseException, str | None], BaseException]
    diagnose_ddp: Callable[[BaseException], PeerError]
    owner: Callable[[object, object], bool]
    liveness: Callable[[], Liveness | None]
    listeners: Sequence[Listener] = ()


@dataclass(slots=True)
class Parts:
    """An `AutotuneState`'s parts, as `build` made them (None: not wanted by this job)."""

    engine: Engine
    #: NCCL's kernel time for the messages NCCL runs, where NCCL loaded autotune's profiler.
    clock: KernelClock | None = None
    #: The fault contract where DDP runs without the hook (`autotune.ddp.guard`).
    guard: Guard | None = None
    #: The live tuner ("auto" without a plan file).
    tuner: Tuner | None = None
    #: Takes the hook out of DDP once the tuner keeps the baseline, or as a plan file says.
    unhooking: Unhooking | None = None
    #: The Prometheus exporter (``Config.metrics_port``; None also where its port was in use).
    exporter: Exporter | None = None

    def close(self) -> None:
        """Stop every part's threads and servers (the engine's after it runs what is queued)."""
        self.engine.close()
        if self.clock is not None:
            self.clock.close()
        if self.tuner is not None:
            self.tuner.close()
        if self.exporter is not None:
            self.exporter.close()
        if self.guard is not None:
            self.guard.close()


def build(
    group: ProcessGroup, config: Config, table: Table | None, channel: int, lent: Lent
) -> Parts:
    """Build the parts for a DDP model reducing over ``group``, as ``config`` and the plan file's
    ``table`` (None: none) say, autotune's traffic on its own ``channel``
    (`autotune.comm.groups.p2p_group`). Collective: call it on every rank at the same point.
    What was built is closed again if a later part fails."""
    world_size = dist.get_world_size(group)
    clock = _nccl_clock(group, world_size)
    engine = Engine(
        group=group,
        world_size=world_size,
        plan=Plan(_initial_choice(config)),
        algorithm_for=lent.algorithm_for,
        fusion_bytes=fusion_bytes_at_start(config, table),
        diagnose=lent.diagnose,
        clock=clock,
    )
    # The parts hear the engine's events (autotune.ddp.events) rather than reach into the state.
    for listener in lent.listeners:
        engine.subscribe(listener)
    parts = Parts(engine, clock)
    try:
        _build_rest(parts, group, config, table, channel, lent)
    except BaseException:
        parts.close()
        raise
    return parts


def _build_rest(
    parts: Parts,
    group: ProcessGroup,
    config: Config,
    table: Table | None,
    channel: int,
    lent: Lent,
) -> None:
    engine = parts.engine
    # Made now, collectively, rather than inside the first backward on the autograd thread;
    # every collective step comes before any step that may fail on one rank. A channel of the
    # state's own: another hooked model's messages never share it.
    engine.channel = p2p_group(group, timedelta(seconds=config.timeout_s), channel)
    refuse_what_cannot_run(config, table, group)
    if table is not None:
        for cls, entry in table.classes.items():
            engine.plan.set(cls, entry.choice)
    tuned = config.algorithm == "auto" and table is None
    if config.unhook and (
        (table is not None and table.buckets is not None) or (tuned and Tuner.would_unhook(config))
    ):
        # Where autotune may unhook itself, DDP then runs on this group. Made now,
        # collectively, before the tuner opens the storage (rank 0 alone may fail that).
        parts.guard = Guard(
            guarded_group(group, config.timeout_s),
            lent.liveness,
            lent.diagnose_ddp,
            _hooked(lent.owner),
        )
    if tuned:
        parts.tuner = Tuner(engine, group, config)
    if table is not None and table.buckets is not None:
        parts.unhooking = plan_file_buckets(
            table, dist.get_world_size(group), config, lent.owner, parts.guard
        )
    live = parts.tuner
    if live is not None and live.unhooks:
        parts.unhooking = Unhooking(
            lambda: live.unhook_from,
            lent.owner,
            bucket_tuner(live, config) if live.tune_fusion else None,
            catch=catch_hooks(live, engine, config),
            guard=parts.guard,
            carry=live.carry_plan,
        )
    if config.metrics_port is not None:
        from autotune import metrics  # prometheus_client only where wanted

        try:
            parts.exporter = metrics.Exporter(
                config, group, engine, parts.tuner, unhooking=parts.unhooking
            )
        except OSError as exc:  # a port in use: an observer never costs the run
            _log.warning(
                "autotune: rank %d serves no metrics and trains on: %s",
                dist.get_rank(group),
                exc.strerror or exc,
            )


def _nccl_clock(group: ProcessGroup, world_size: int) -> KernelClock | None:
    """NCCL's kernel time beside the GPU's events, where NCCL loaded autotune's profiler. Not at
    world size 1: NCCL's one-rank path runs no algorithm and calls no profiler."""
    nccl_feed = feed() if backend_name(group) == "nccl" and world_size > 1 else None
    if nccl_feed is None:
        return None
    if dist.get_rank(group) == 0:
        _log.info("autotune: NCCL's kernel time recorded beside each message (its profiler)")
    return KernelClock(nccl_feed, world_size)


def _initial_choice(config: Config) -> Choice:
    if config.algorithm == "auto":
        return BASELINE_CHOICE  # the backend's own, until a plan beats it on the step
    return Choice.parse(config.algorithm, config.segment_bytes)  # "ring+bf16" compresses


def _hooked(
    ours: Callable[[object, object], bool],
) -> Callable[[DistributedDataParallel], bool]:
    """Whether autotune's hook (``ours``) is on a DDP model now."""

    def hooked(ddp: DistributedDataParallel) -> bool:
        return any(ours(*h) for h in getattr(ddp, "_comm_hooks", ()))

    return hooked
