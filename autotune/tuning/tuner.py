"""The live tuner on every rank: windows, the cross-rank exchange, the orders applied.

After an iteration, one MAX all-reduce starts on a group of the tuner's own, carrying each rank's
window (message latencies per size class, the step; `autotune.tuning.wire` says which of each is
kept) together with rank 0's orders (the plan every rank runs next). It travels during the next
iteration's compute and is finished at that iteration's end, at the same point of the bucket
sequence on every rank, where every rank applies the orders it received: all ranks always run
the same plan for the same message. Rank 0 decides with its `Decider`
(`autotune.tuning.decider`); every rank keeps what the orders said (the phase, the gain, when
the job unhooks, when the check against plain DDP runs), which `autotune.tuning.status` reads.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

import autotune.tuning.wire as wire
from autotune.algorithms import (
    COMPRESSIBLE,
    agreed,
    bookkeeping_device,
    carried,
    carry,
    current_device,
    sibling_group,
)
from autotune.comm import topology
from autotune.ddp.events import Event, Failure, IterationDone, IterationEnd
from autotune.ddp.stats import MessageRecord
from autotune.plan import Arm, Buckets, Choice, Entry, Gain, Table
from autotune.tuning.blocks import BLOCK_STEPS
from autotune.tuning.decider import Decider
from autotune.tuning.paired_test import Outcome
from autotune.tuning.search import NOT_MEASURED, Progress
from autotune.tuning.space import search_space
from autotune.tuning.steps import StepLog

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.ddp.engine import Engine

__all__ = ["Tuner"]

#: Once everything is locked, exchange every this many iterations.
WATCH_EVERY = 10


class Tuner:
    """Tunes ``engine``'s plan live over ``group`` (the job's); `AutotuneState` makes one when
    ``config.algorithm`` is "auto" and no plan file is given. Rank 0's decisions are its
    `decider`'s."""

    def __init__(self, engine: Engine, group: dist.ProcessGroup, config: Config) -> None:
        self.engine = engine
        self.process_group = group
        self.config = config
        self.rank = dist.get_rank(group)
        self.tune_fusion = config.fusion_bytes is None
        baseline = self.baseline = Arm((), config.fusion_bytes or 0)
        #: Whether the job unhooks once it keeps the baseline (`autotune.tuning.unhooked`): only
        #: where the baseline is what the job had without autotune, DDP's own buckets. Where it
        #: does, a plan that needs the hook meets plain DDP before it is locked
        #: (`autotune.tuning.plain_check`).
        self.unhooks = self.would_unhook(config)
        #: What every rank runs now, as rank 0 ordered it (the baseline until it does).
        self.arm = baseline
        self.cadence = wire.EXPLORING
        #: Where tuning stands, as every rank hears it: per size class, the phase, the gain.
        self.states: dict[int, str] = {}
        self.phase = "loading"
        self.gain: Gain | None = None
        #: Iterations before the plan is locked, as rank 0 estimated them for the stages known
        #: then (None: not known yet; `autotune.tuning.status.Status.iterations_left`).
        self.to_go: int | None = None
        #: The iteration from which every rank runs, locked, a plan DDP runs itself (None: it
        #: does not): the baseline, or where the fusion size is tuned, the backend's all-reduce
        #: for every class at any fusion size, which `autotune.tuning.buckets` turns into DDP's own
        #: bucket size. Set at the same iteration end on every rank, where the orders arrive.
        self.unhook_from: int | None = None
        #: DDP's bucket size as this job keeps it, or as a previous job stored it until this
        #: job's search decides (rank 0 reads it from the storage; every rank sets it then).
        self.buckets: Buckets | None = None
        #: The iteration from which the check against plain DDP runs
        #: (`autotune.tuning.plain_check`; None: none is due), set at the same iteration end on
        #: every rank, from orders in the ``catch`` phase. Stale such orders (sent before the check
        #: against plain DDP ended) do not start another: one is due again only after orders in
        #: another phase.
        self.check_from: int | None = None
        #: Timed steps per block of that check, from the same orders
        #: (`autotune.tuning.blocks.check_steps_for`).
        self.check_steps = BLOCK_STEPS
        self._catch_armed = True
        #: The model in words (`autotune.storage.describe_model`), stored with the plan for
        #: `autotune show`: set by `autotune.register`; else, at the first exchange, what the
        #: gradient layout says.
        self.described: str | None = None
        self._spaces: dict[int, list[Choice]] = {}
        self._latencies: dict[int, list[float]] = {}
        #: This window's steps, each with the plan its iteration ran.
        self._steps = StepLog()
        self._exchange_device: torch.device | None = None
        # The exchange in flight: started at one iteration end, finished at the next, with the
        # plan its measurements ran under.
        self._exchange: tuple[dist.Work, torch.Tensor, Arm, Arm] | None = None
        self._window_arm = baseline
        self._received: tuple[wire.Window, Arm, Arm] | None = None
        #: Tuning stopped for good: rank 0's storage failed mid-job (set on rank 0 at once, on
        #: every rank where the orders that say so arrive).
        self.frozen = False
        # The exchange's own group: it runs alongside the next iteration's messages, and
        # collectives on a shared group would have to be issued in the same order everywhere.
        # On the host (gloo) whatever the job runs: launched from the completing thread, on
        # NCCL it would race the job's own launches (`autotune.comm.groups.host_backend`).
        # Made before the storage is opened, which can fail on rank 0 alone.
        self.group = sibling_group(group, "tuner", timedelta(seconds=config.timeout_s), host=True)
        # Which ranks share a node, for the fingerprint: learnt here, where every rank is.
        self.topology = topology.detect(self.group, timedelta(seconds=config.timeout_s))
        #: What "auto" chooses among: the configured candidates this group can run.
        self.candidates = agreed(
            config.candidates, group, current_device(), timedelta(seconds=config.timeout_s)
        )
        if not self.candidates:
            raise ValueError(
                f"Config.algorithms: none of {', '.join(config.candidates)} can run on this "
                "group (the log says why); add 'native' or another built-in"
            )
        #: Rank 0's decisions and storage (`autotune.tuning.decider`); None on other ranks.
        self.decider = Decider(self) if self.rank == 0 else None
        #: Seconds each iteration's off-path work took (learning, deciding, starting the exchange).
        self.off_path_s: deque[float] = deque(maxlen=100_000)
        engine.subscribe(self._on_event)

    @staticmethod
    def would_unhook(config: Config) -> bool:
        """Whether a tuner with ``config`` unhooks once it keeps the baseline: only where
        the baseline is what the job had without autotune, DDP's own buckets."""
        return config.unhook and not config.fusion_bytes

    def _on_event(self, event: Event) -> None:
        if isinstance(event, MessageRecord):
            self._latencies.setdefault(event.size_class, []).append(event.seconds)
        elif isinstance(event, IterationEnd):
            self._on_iteration_end(event.iteration, event.step_s, event.step_of)
        elif isinstance(event, IterationDone):
            self._after_iteration(event.iteration)
        elif isinstance(event, Failure):
            self._on_failure(event.error)

    def _on_iteration_end(self, iteration: int, step_s: float | None, step_of: int | None) -> None:
        """Before this iteration's futures complete: take in the exchange started one iteration
        ago, so the plan it carries is in effect for every rank's next iteration. The step is
        ``step_of``'s (on CUDA, the GPU's of an iteration a few back: `autotune.ddp.step_clock`),
        kept with the plan that iteration ran."""
        self._steps.ended(iteration, self.arm, step_s, step_of)
        if self._exchange is not None:
            work, result, latencies_under, step_under = self._exchange
            self._exchange = None
            work.wait(timedelta(seconds=self.config.timeout_s))
            window, orders = wire.read(result.tolist())
            self._received = (window, latencies_under, step_under)
            if orders is not None:
                self._apply(orders, iteration + 1)

    def _after_iteration(self, iteration: int) -> None:
        """After the futures (off the step's critical path): learn, decide, start the next
        exchange, which travels during the next iteration's compute."""
        begin = time.perf_counter()
        if self._received is not None:
            window, latencies_under, step_under = self._received
            self._received = None
            if self.decider is not None:
                self.decider.learn(window, latencies_under, step_under)
        if self.cadence == wire.LOCKED and iteration % WATCH_EVERY:
            if self.arm != self._window_arm:  # a window holds one plan's iterations, or none
                self._new_window()
        else:
            latencies = {c: min(s) for c, s in self._latencies.items()}  # see wire.Window
            step_under, step = self._steps.window(self._window_arm)
            orders = None if self.decider is None else self.decider.decide(iteration)
            row = wire.write(wire.Window(latencies, step), orders)
            self._exchange = (*self._start_all_reduce_max(row), self._window_arm, step_under)
            self.engine.switch_at(iteration + 1)  # where the orders it carries take effect
            self._new_window()
        self.off_path_s.append(time.perf_counter() - begin)

    def _new_window(self) -> None:
        self._latencies.clear()
        self._steps.clear()
        self._window_arm = self.arm

    def _start_all_reduce_max(self, row: list[float]) -> tuple[dist.Work, torch.Tensor]:
        group = self.group
        if self._exchange_device is None:
            assert self.engine.device is not None
            self._exchange_device = bookkeeping_device(group, self.engine.device)
        # Plain lists, one tensor: this thread competes with training for the GIL.
        t = torch.tensor(row, dtype=torch.float64).to(self._exchange_device)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
        assert work is not None
        return work, t

    def _apply(self, orders: wire.Orders, effective: int) -> None:
        """Rank 0's orders, in effect from iteration ``effective`` on."""
        choices = {cls: self.space(cls)[code - 1] for cls, code in orders.codes.items()}
        arm = Arm.of(choices, orders.fusion_bytes)
        if arm != self.arm:
            self.engine.plan.replace(choices)
            self.engine.fusion_bytes = orders.fusion_bytes
            self.arm = arm
        self.states.update(orders.states)
        self.cadence, self.phase, self.gain = orders.cadence, orders.phase, orders.gain
        self.to_go = orders.to_go
        self.frozen = self.frozen or orders.frozen
        if orders.phase != "catch":
            self._catch_armed = True
        elif self._catch_armed and self.check_from is None:
            self.check_from, self._catch_armed = effective, False
            self.check_steps = orders.check_steps
        ddp_runs_it = not self.needs_hook(arm) and (
            self.tune_fusion or arm.fusion_bytes == self.baseline.fusion_bytes
        )
        if self.cadence != wire.LOCKED or not ddp_runs_it:
            self.unhook_from = None
        elif self.unhook_from is None:
            self.unhook_from = effective

    @staticmethod
    def needs_hook(arm: Arm) -> bool:
        """Whether ``arm`` runs only through the hook: a class on a Python-driven schedule. The
        baseline's choices and autotune-nccl's cells run on DDP itself once autotune unhooks
        (`autotune.algorithms.carried`), a fusion size as DDP's bucket size."""
        return any(not carried(c) for _, c in arm.choices)

    def carry_plan(self) -> list[str]:
        """Every rank, as autotune unhooks: hand the locked plan's classes to the backend (NCCL's
        tuner plugin's table; nothing for the baseline's); what it now runs."""
        classes = self.arm.as_dict()
        if not classes:
            return []
        return carry(classes, dist.get_world_size(self.process_group))

    def caught(self, kept: bool, outcome: Outcome | None) -> None:
        """Every rank, once the check against plain DDP is over
        (`autotune.tuning.unhooked.Unhooking`, settled): ``kept``, the plan runs on through the
        hook; else the job has unhooked, and rank 0 stores the baseline for the next job."""
        self.check_from = None
        if not kept:
            self.unhook_from = self.engine.iteration
            # DDP's own all-reduce runs from here: the plan says so (`AutotuneState.plan`). The
            # arm stays: its fusion size is the first bucket size DDP's search tries
            # (`autotune.tuning.unhooked.bucket_tuner`).
            self.engine.plan.replace({})
        if self.decider is not None:
            self.decider.caught(kept, outcome)

    def _on_failure(self, error: BaseException) -> None:
        if self.decider is None:
            return
        # The job is going down: record the trials in flight as failed, not as fast.
        self.decider.abandon(NOT_MEASURED + repr(error))
        self.decider.close(timeout_s=10.0)

    @property
    def settled(self) -> bool:
        """Whether every rank knows that the plan is locked (exchanges are down to watching)."""
        return self.cadence == wire.LOCKED

    @property
    def locked(self) -> bool:
        """Whether the plan runs locked, as rank 0's orders said it to every rank at the same
        iteration: a re-check of it included (it keeps the plan unless the plan lost its gain),
        the check against plain DDP not (it decides whether the plan stays)."""
        return self.phase == "locked" and self.check_from is None

    def close(self) -> None:
        if self.decider is not None:
            self.decider.abandon(NOT_MEASURED + "the job ended before the trial finished")
            self.decider.close(timeout_s=30.0)

    def space(self, cls: int) -> list[Choice]:
        """The choices for size class ``cls``, in the order the wire's codes index them."""
        space = self._spaces.get(cls)
        if space is None:
            dtype = self.engine.dtype
            assert dtype is not None, "a size class's space is asked for before its first bucket"
            # Compressed only where the job allows it and the gradients are wider than the wire
            # (bf16 or fp16 gradients gain nothing from a cast).
            wires = self.config.compression if dtype in COMPRESSIBLE else ()
            space = search_space(cls, self.candidates, self.topology, wires)
            self._spaces[cls] = space
        return space

    def table(self) -> Table:
        """The plan as rank 0 knows it (`Decider.table`); on another rank, what every rank
        hears."""
        if self.decider is not None:
            return self.decider.table()
        classes = {
            cls: Entry(c, state=self.states.get(cls, "exploring"))
            for cls, c in self.engine.plan.table().items()
        }
        return Table(classes, self.arm.fusion_bytes, None, self.gain, model=self.described)

    def progress(self) -> dict[int | str, Progress]:
        """Per size class (and "fusion"), as rank 0 knows it; empty on another rank."""
        return {} if self.decider is None else self.decider.progress()

    def buckets_kept(self, buckets: Buckets) -> None:
        """Every rank, once `autotune.tuning.buckets` has decided (the hook no longer runs): the
        step gain is now the bucket size's over plain DDP's (None: the job's own buckets, 1.00x).
        Rank 0 stores the table with it for the next job."""
        self.buckets = buckets
        self.gain = buckets.gain
        if self.decider is not None and self.decider.key:
            self.decider.store_table()
