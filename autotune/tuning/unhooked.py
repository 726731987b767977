"""Unhooking: once the tuner keeps the baseline, DDP gets its own all-reduce back; and what the
tuner hands DDP then (the search over DDP's own bucket size, the check of a plan that needs the
hook against plain DDP), built for one state.

A comm hook costs every bucket a Python call and a separate 1/N pass (docs/BENCHMARKS.md, "The
hook"); where no plan beats the baseline that is all autotune would add, so it removes itself:
DDP keeps a comm hook for good, so its reducer is rebuilt without it
(`autotune.ddp.reducer.rebuild_reducer`) and the job runs as plain DDP from there.

`Unhooking` does it on every rank before the same iteration's forward (the new reducer's first
bucket rebuild is a broadcast): the tuner names the iteration (`Tuner.unhook_from`, the same on
every rank), the hook checks it at each iteration's last bucket (`Unhooking.check`), and a
forward pre-hook swaps at the next forward. Where the model cannot be rebuilt (a torch without
those methods, another comm hook beside autotune's), autotune says why once and keeps the hook on
the baseline's lane. The same pre-hook runs the check against plain DDP
(`autotune.tuning.plain_check`, `catch_hooks`) and DDP's bucket-size search
(`autotune.tuning.buckets`, `bucket_tuner`; a plan file's size: `plan_file_buckets`).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from torch.nn.parallel import DistributedDataParallel

from autotune.algorithms import carry
from autotune.config import Config
from autotune.ddp.engine import Engine
from autotune.ddp.guard import Guard
from autotune.ddp.join import JoinWatch
from autotune.ddp.reducer import (
    rebuild_reducer,
    restore_bucket_config,
    saved_bucket_config,
    set_bucket_cap,
    why_not_rebuilt,
)
from autotune.plan import Table
from autotune.tuning.buckets import MAX_PAIRS, BucketTuner, why_not_tuned
from autotune.tuning.paired_test import Outcome
from autotune.tuning.plain_check import PlainCheck
from autotune.tuning.tuner import Tuner

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

__all__ = ["PlainCheckHooks", "Unhooking", "bucket_tuner", "catch_hooks", "plan_file_buckets"]

_log = logging.getLogger("autotune")


@dataclasses.dataclass(frozen=True)
class PlainCheckHooks:
    """What `Unhooking` needs to run the check against plain DDP (`autotune.tuning.plain_check`)."""

    #: The iteration from which the check against plain DDP runs (None: none is due), the same on
    #: every rank.
    due: Callable[[], int | None]
    #: The check against plain DDP for the model.
    make: Callable[[DistributedDataParallel], PlainCheck]
    #: Told on every rank once it is over: whether the hook runs on, and the paired test's outcome
    #: (None: it could not run, or stopped).
    over: Callable[[bool, Outcome | None], None]
    #: Iterations run through the hook so far.
    iteration: Callable[[], int]


class Unhooking:
    """Removes autotune's hook from its DDP model once every rank runs the locked baseline.

    ``unhook_from`` says from which iteration on that is so (None: not, or not yet); the hook
    calls `check` at every iteration's last bucket. ``ours(hook, state)``: whether a comm hook a
    DDP model holds (the function and the state it was registered with) is this one.
    ``buckets(ddp)``: once unhooked, the `BucketTuner` that tunes DDP's bucket size from the same
    forward pre-hook (None: DDP's buckets stay as the job built them); ``bucket_bytes``: a size
    to rebuild DDP's reducer with instead (a plan file's, `autotune.plan.Buckets`).
    ``catch``: where the tuner may lock a plan that needs the hook (see the module doc).
    ``guard``: keeps the fault contract on the model once it runs without the hook
    (`autotune.ddp.guard`): it watches the model from when it is known, and DDP's reducers are
    rebuilt on its group. ``carry``: hands the locked plan's classes to the backend before the
    reducer is rebuilt (`autotune.algorithms.carry`: NCCL's tuner plugin's table), on every rank
    at the same forward; what the backend now runs.
    """

    def __init__(
        self,
        unhook_from: Callable[[], int | None],
        ours: Callable[[object, object], bool],
        buckets: Callable[[DistributedDataParallel], BucketTuner | None] | None = None,
        bucket_bytes: int | None = None,
        catch: PlainCheckHooks | None = None,
        guard: Guard | None = None,
        carry: Callable[[], list[str]] | None = None,
    ) -> None:
        self._aside_from = unhook_from
        self._carry = carry
        self._guard = guard
        self._catch_hooks = catch
        #: The check against plain DDP under way, or the last one run (None: none has run).
        self.catch: PlainCheck | None = None
        self._caught_for: int | None = None  # the `PlainCheckHooks.due` of the last check begun
        self._bucket_bytes = bucket_bytes
        self._ours = ours
        self._buckets = buckets
        #: Tuning DDP's bucket size, once unhooked (None: not, or not yet).
        self.buckets: BucketTuner | None = None
        self._model: weakref.ref[DistributedDataParallel] | None = None
        self._handle: RemovableHandle | None = None
        self.refused: str | None = None
        #: The iterations (backward passes through the hook) before autotune unhooked.
        self.at: int | None = None
        #: Whether DDP's Join is open on the model (`autotune.ddp.join`), once it is known.
        self._join: JoinWatch | None = None
        #: Forwards held while a Join was open, in all (what a job's log is told once per Join).
        self.held = 0
        self._holding = False
        self._due = 0  # the iteration whose end the pre-hook waits for (`check`)

    def attach(self, ddp: DistributedDataParallel) -> None:
        """The model the state is registered on (else it is looked up when needed)."""
        self._model = weakref.ref(ddp)
        self._watch_join(ddp)
        if self._guard is not None:
            self._guard.watch(ddp)

    def _watch_join(self, ddp: DistributedDataParallel) -> None:
        if self._join is None or self._join.model is not ddp:
            if self._join is not None:
                self._join.close()
            self._join = JoinWatch(ddp, self._shadow)

    def check(self, iteration: int) -> None:
        """At ``iteration``'s last bucket: once the baseline is locked from it or earlier, swap
        the reducer before the model's next forward; once a check against plain DDP is due, begin
        it there."""
        if self._handle is not None or self.refused is not None or self.at is not None:
            return
        hooks = self._catch_hooks
        due = None if hooks is None else hooks.due()
        catch_due = due is not None and iteration >= due and due != self._caught_for
        start = self._aside_from()
        if not catch_due and (start is None or iteration < start):
            return
        ddp, why = self._find()
        if ddp is not None:
            why = why_not_rebuilt(ddp, self._ours)
        if why is not None or ddp is None:
            self._refuse(why or "no model", catch_due)
            if catch_due and hooks is not None:
                self._caught_for = due
                hooks.over(True, None)  # the plan runs on, as its paired tests chose it
            return
        if self._guard is not None:
            self._guard.watch(ddp)
        if catch_due and hooks is not None:
            self._caught_for = due
            self.catch = hooks.make(ddp)
        self._due = iteration
        self._handle = ddp.register_forward_pre_hook(
            lambda module, args: self._pre_forward(ddp, iteration)
        )

    def _pre_forward(self, ddp: DistributedDataParallel, iteration: int) -> None:
        if self._join is not None and self._join.open:
            self._under_join(ddp, iteration)
            return
        self._holding = False
        if self._guard is not None:
            self._guard.adopt_group(ddp)  # before any rebuild below: the reducers run on it
        catch = self.catch
        if catch is not None and not catch.over:
            assert self._catch_hooks is not None
            if catch.pre_forward():
                return
            self._catch_hooks.over(catch.hooked, catch.outcome)
            if catch.hooked:  # the plan runs on, through the hook
                self._remove()
                return
            self._aside(ddp, self._catch_hooks.iteration(), "its plan lost to plain DDP")
        elif self.at is None:
            self._swap(ddp, iteration)
        tuner = self.buckets
        if tuner is not None and not tuner.pre_forward():
            self._remove()

    def _under_join(self, ddp: DistributedDataParallel, iteration: int) -> None:
        """A forward while DDP's Join is open (`autotune.ddp.join`): an unhook that is due
        happens, as a rank that has joined does it in its shadow of the same iteration
        (`_shadow`), on the job's group (Join's collectives stay on the group it was built
        with); the rest holds."""
        catch = self.catch
        if self.at is None and (catch is None or catch.over):
            self._swap(ddp, iteration)
            if self._handle is None:
                return  # nothing left for the pre-hook to do
        self._hold()

    def _shadow(self) -> None:
        """On a rank that has joined, before its shadow of the others' next iteration (DDP's
        join hook): what their pre-hook does under the Join, here an unhook that is due."""
        ddp = None if self._model is None else self._model()
        if self._handle is None or ddp is None:
            return
        self._under_join(ddp, self._due)

    def _hold(self) -> None:
        """A forward while DDP's Join is open: nothing collective of this module's runs
        (`autotune.ddp.join` says why), on every rank alike; a block of steps under way begins
        again after it."""
        self.held += 1
        if self._holding:
            return
        self._holding = True
        checking = self.catch if self.catch is not None and not self.catch.over else None
        if checking is not None:
            checking.restart()
        if self.buckets is not None:
            self.buckets.restart()
        what = (
            "its check against plain DDP"
            if checking is not None
            else "DDP's bucket-size search"
            if self.buckets is not None
            else "unhooking"
        )
        _log.info(
            "autotune holds %s while DDP's Join is open (uneven inputs: a rank that has "
            "joined runs no forward to meet its collectives at); it goes on at the first "
            "forward after the Join",
            what,
        )

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _swap(self, ddp: DistributedDataParallel, iteration: int) -> None:
        assert self._handle is not None
        saved = saved_bucket_config(ddp)
        try:
            if self._bucket_bytes is not None:
                set_bucket_cap(ddp, self._bucket_bytes)
            rebuild_reducer(ddp)
        except Exception as exc:
            restore_bucket_config(ddp, saved)
            self._remove()
            self._refuse(f"rebuilding DDP's reducer failed: {exc!r}")
            return
        # Every rank hands the same classes over at the same forward: NCCL must run one
        # algorithm and protocol for an all-reduce on every rank. A failure here raises.
        carried = [] if self._carry is None else self._carry()
        why = "the locked plan is the backend's own all-reduce"
        if carried:
            why = f"the locked plan runs on the backend's own all-reduce ({'; '.join(carried)})"
        self._aside(ddp, iteration, why)

    def _aside(self, ddp: DistributedDataParallel, iteration: int, why: str) -> None:
        """The reducer has no hook from after ``iteration`` on: DDP's bucket size next."""
        self.at = iteration
        self.buckets = None if self._buckets is None else self._buckets(ddp)
        if self.buckets is None:
            self._remove()
        _log.info(
            "autotune unhooks after iteration %d: %s, so DDP runs its own all-reduce "
            "without the hook from here on",
            iteration,
            why,
        )

    def _find(self) -> tuple[DistributedDataParallel | None, str | None]:
        """The model, or None and why not."""
        if self._model is not None:
            model = self._model()
            return model, None if model is not None else "the model is gone"
        # Registered with ddp_model.register_comm_hook(state, hook): the state was not told its
        # model. Looked up once, among the objects the collector tracks.
        found = [
            o
            for o in gc.get_objects()
            if isinstance(o, DistributedDataParallel)
            and any(self._ours(*h) for h in getattr(o, "_comm_hooks", ()))
        ]
        if len(found) != 1:
            return None, f"the state is registered on {len(found)} DDP models, not one"
        self._model = weakref.ref(found[0])
        self._watch_join(found[0])
        return found[0], None

    def _refuse(self, why: str, catch: bool = False) -> None:
        self.refused = why
        if catch:
            _log.warning(
                "autotune keeps its hook, running the plan its paired tests chose, unchecked "
                "against plain DDP: it cannot rebuild DDP's reducer (%s), and cannot unhook either",
                why,
            )
            return
        _log.warning(
            "autotune keeps its hook, running the backend's own all-reduce, although no plan "
            "beat it: it cannot unhook (%s). Its cost is the hook's (docs/HOOK.md)",
            why,
        )


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
            steps=tuner.check_steps,
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
