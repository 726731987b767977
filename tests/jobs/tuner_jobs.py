"""Jobs the tuner tests run on spawned ranks, and algorithms with injected delays."""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from ddp_jobs import digest
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.algorithms import Comm, NativeAllReduce, Pending, RingAllReduce, register
from autotune.testing import played_nccl
from autotune.testing.settled import all_settled, everywhere

#: Messages up to this many bytes are "small" for the size-dependent algorithms below.
SMALL_BYTES = 100_000
DELAY_S = 0.03


class SlowRing(RingAllReduce):
    """A working ring with an injected delay: the tuner must stop choosing it."""

    name = "slow_ring"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        time.sleep(DELAY_S)
        super()._run(buf, comm, segment_elems)


class FastSmall(RingAllReduce):
    """A ring that is slow for large messages only."""

    name = "fast_small"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        if buf.numel() * buf.element_size() > SMALL_BYTES:
            time.sleep(DELAY_S)
        super()._run(buf, comm, segment_elems)


class FastLarge(RingAllReduce):
    """A ring that is slow for small messages only."""

    name = "fast_large"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        if buf.numel() * buf.element_size() <= SMALL_BYTES:
            time.sleep(DELAY_S)
        super()._run(buf, comm, segment_elems)


class GilHog(RingAllReduce):
    """A ring whose messages finish as fast as the ring's, but which then holds the GIL for
    ``DELAY_S`` on a thread of its own (one sort, a single C call): its latency looks fine, while
    the training thread, and backward's hook calls, wait. Only the step shows the cost."""

    name = "gil_hog"

    def _start(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> Pending:
        self._run(buf, comm, segment_elems)
        threading.Thread(target=_hold_the_gil, daemon=True).start()
        return Pending()


_SORT_ME: list[float] = []


def _hold_the_gil() -> None:
    """About DELAY_S inside one list.sort call, which never releases the GIL."""
    if not _SORT_ME:
        import random

        rng = random.Random(0)
        n = 20_000
        values = [rng.random() for _ in range(n)]
        begin = time.perf_counter()
        sorted(values)
        per_item = (time.perf_counter() - begin) / n
        _SORT_ME.extend(rng.random() for _ in range(int(DELAY_S / max(per_item, 1e-9))))
    sorted(_SORT_ME)


#: Switched by `tune` at its ``flip_at`` step, on every rank alike.
CONDITIONS = {"native_slow": False, "quick_ring_slow": False}


class SlowNative(NativeAllReduce):
    """The backend's all-reduce, ``DELAY_S`` later while ``CONDITIONS["native_slow"]``: a
    baseline that some plan can beat (registered as "native" in the jobs that want one)."""

    def _start(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> Pending:
        pending = super()._start(buf, comm, segment_elems)
        if not CONDITIONS["native_slow"]:
            return pending

        def wait() -> None:
            pending.wait()
            time.sleep(DELAY_S)

        return Pending(wait)


class QuickRing(RingAllReduce):
    """The ring, ``DELAY_S`` slower per message while ``CONDITIONS["quick_ring_slow"]``."""

    name = "quick_ring"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        if CONDITIONS["quick_ring_slow"]:
            time.sleep(DELAY_S)
        super()._run(buf, comm, segment_elems)


def register_injected() -> None:
    """Register the algorithms above, so that this process can run (or read a table naming) them."""
    for cls in (SlowRing, FastSmall, FastLarge, GilHog, QuickRing):
        register(cls.name, cls, replace=True)


def model(width: int = 1024) -> torch.nn.Module:
    """With bucket_cap_mb=0.05, two buckets either side of SMALL_BYTES from the second iteration
    (after DDP rebuilds them): 66 KB and 1.05 MB (``width`` 1023: a few bytes less each, in the
    same size classes, another model to the storage)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 8),
    )


BUCKET_CAP_MB = 0.05
#: No warm-up, one sample a trial, short paired tests and frequent re-checks: the plan keeps
#: changing (add a storage).
KEEPS_SWITCHING: dict[str, Any] = {
    "tune_warmup": 0,
    "tune_samples": 1,
    "max_pairs": 6,
    "recheck_every": 10,
    "algorithms": ("native", "ring", "tree", "two_tree"),
}


@dataclass
class Tuned:
    plan: dict[int, autotune.Choice]
    fusion_bytes: int
    progress: dict[Any, Any]
    messages: list[tuple[int, int, str, int | None]]  # (iteration, bytes, algorithm, segment)
    duels: list[tuple[str, str, bool]]  # (kind, challenger, won), rank 0's, oldest first
    baseline_kept: bool
    hooked: str  # digest of the parameters
    plain_rel: float  # largest relative distance from DDP without the hook, per parameter
    settled: bool
    steps_run: int
    #: After each step: (`AutotuneState.locked`, `AutotuneState.settled`) on this rank.
    states: list[tuple[bool, bool]]
    candidates: tuple[str, ...]  # what the tuner chose among, as the group agreed
    workload: str  # the workload its plan is stored under (rank 0's; "" elsewhere)
    #: After each step: `state.status()`'s headline and its phase, on this rank.
    headlines: list[tuple[str, str]] = field(default_factory=list)
    #: After each step: `Status.final`, and `state.table()`'s `Table.final`.
    finals: list[tuple[bool, bool]] = field(default_factory=list)


def tune(
    rank: int,
    world_size: int,
    steps: int,
    config: dict[str, Any],
    compare: bool,
    slow_native: bool = False,
    flip_at: int | None = None,
    until_settled: bool = False,
    width: int = 1024,
    until_won: bool = False,
    then: int = 0,
) -> Tuned:
    """Train with the tuner on (and, if ``compare``, beside DDP without a hook). With
    ``slow_native`` the baseline is `SlowNative`; at step ``flip_at`` it turns fast and
    `QuickRing` slow. With ``until_settled``, ``steps`` is a cap: training stops once every
    rank knows the plan is locked (with ``flip_at``: after the flip, locked on the baseline).
    How many iterations tuning takes depends on how soon the tuner's Optuna worker answers,
    which a loaded machine slows; a fixed count would not; ``then`` more steps run after that
    (the plan settled on: the orders that settle it arrive while an iteration of the plan before
    may still be running). With ``until_won``, training stops (undecided) once every rank has
    heard that a plan beat the baseline."""
    register_injected()
    register("native", SlowNative if slow_native else NativeAllReduce, replace=True)
    if slow_native:
        # The baseline is slowed through the hook only: a job that unhooks would take its
        # plan to plain DDP itself, which is not (`autotune.tuning.plain_check`,
        # tests/tuning/test_plain_check.py).
        config = {"unhook": False, **config}
    CONDITIONS.update(native_slow=slow_native, quick_ring_slow=False)
    base = model(width)
    hooked = DDP(copy.deepcopy(base), bucket_cap_mb=BUCKET_CAP_MB)
    state = autotune.register(hooked, autotune.Config(timeout_s=60, **config))
    models = (
        [hooked, DDP(copy.deepcopy(base), bucket_cap_mb=BUCKET_CAP_MB)] if compare else [hooked]
    )
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    g = torch.Generator().manual_seed(rank)
    steps_run = 0
    states: list[tuple[bool, bool]] = []
    headlines: list[tuple[str, str]] = []
    finals: list[tuple[bool, bool]] = []
    since_settled: int | None = None  # steps trained once every rank had settled
    for step in range(steps):
        after_flip = flip_at is None or step > flip_at
        if (
            until_settled
            and after_flip
            and since_settled is None
            and all_settled(state, flip_at is not None)
        ):
            since_settled = 0
        if since_settled is not None:
            if since_settled == then:
                break
            since_settled += 1
        if until_won:
            state.status()  # the engine settled: every rank has heard the same orders
            won = state.tuner is not None and state.tuner.gain is not None
            if everywhere(won):
                break  # a plan has beaten the baseline, undecided: the job ends here
        steps_run += 1
        if step == flip_at:
            CONDITIONS.update(native_slow=False, quick_ring_slow=True)
        x, y = torch.randn(32, 256, generator=g), torch.randint(0, 8, (32,), generator=g)
        for m, opt in zip(models, optimizers, strict=True):
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
        states.append((state.locked, state.settled))
        now = state.status()
        headlines.append((now.headline, now.phase))
        finals.append((now.final, state.table().final))
    assert state.tuner is not None
    rel = 0.0
    if compare:
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
            rel = max(rel, float((a.double() - b.double()).norm() / b.double().norm()))
    played_nccl.final_check()  # on the played NCCL: one order of launches everywhere
    state.engine.settle(30)
    result = Tuned(
        plan=state.plan(),
        fusion_bytes=state.engine.fusion_bytes,
        progress=state.tuner.progress() if rank == 0 else {},
        messages=[
            (r.iteration, r.nbytes, r.algorithm, r.segment_bytes) for r in state.recorder.records()
        ],
        hooked=digest(list(hooked.parameters())),
        plain_rel=rel,
        settled=state.tuner.settled,
        steps_run=steps_run,
        states=states,
        candidates=state.tuner.candidates,
        workload=state.tuner.decider.workload if state.tuner.decider else "",
        duels=[
            (kind, arm.describe(), outcome.challenger_won)
            for kind, arm, outcome in (
                state.tuner.decider.plan_search.history if state.tuner.decider else []
            )
        ],
        baseline_kept=bool(state.tuner.decider and state.tuner.decider.plan_search.baseline_kept),
        headlines=headlines,
        finals=finals,
    )
    state.close()
    return result


def fixed_from_file(
    rank: int, world_size: int, plan_file: str
) -> tuple[bool, set[str], dict[int, Any]]:
    """Config(plan_file=...): the table's choices, no tuner."""
    state_holder = DDP(model(), bucket_cap_mb=BUCKET_CAP_MB)
    state = autotune.register(state_holder, autotune.Config(plan_file=plan_file))
    opt = torch.optim.SGD(state_holder.parameters(), lr=0.05)
    for _ in range(4):
        x, y = torch.randn(8, 256), torch.randint(0, 8, (8,))
        torch.nn.functional.cross_entropy(state_holder(x), y).backward()
        opt.step()
        opt.zero_grad()
    state.engine.settle(30)
    used = {r.algorithm for r in state.recorder.records() if r.iteration >= 1}
    result = (state.tuner is None, used, state.plan())
    state.close()
    return result


def register_with_plan_file(rank: int, world_size: int, plan_file: str) -> str:
    """Register with ``plan_file``; the error register raises (no step is taken)."""
    try:
        autotune.register(DDP(model()), autotune.Config(plan_file=plan_file)).close()
    except ValueError as exc:
        return str(exc)
    return "no error"
