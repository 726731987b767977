"""The reference's catch: a locked plan that needs the hook, against plain DDP itself.

The plan search's paired tests (`autotune.tuning.plan_search`) run the baseline through the hook:
the backend's all-reduce, called from Python per bucket, with its own 1/N pass. Once it keeps the
baseline, though, the job unhooks (`autotune.ddp.unhook`) and runs plain DDP, which is faster
than that by the hook's own cost: 8-14% of the example mlp's step on 2 shared cores, 0-2.5% of
the transformer's (docs/BENCHMARKS.md). So a plan that beat the hooked baseline by less than
that runs slower than what the job would otherwise run. Measured: on the mlp at 2 ranks, `shm`
for the 2 MiB class won its paired test against the hooked baseline at 0.797x over 10 pairs
(0.83-0.97x in its re-checks) and ran 1.066x plain DDP's step.

So where a job unhooks for the baseline, a plan that needs the hook is locked only once it
has met plain DDP: the job's reducer as it built it, without the hook (A), against a reducer
with autotune's hook running the plan (B), in blocks of `BLOCK` iterations, A B B A
(`autotune.tuning.blocks`; each switch rebuilds the reducer as unhooking does, and registers
the hook again for B). The paired test is a first bucket paired test's
(`autotune.tuning.buckets.bucket_test`): B is kept only if it is faster than plain DDP beyond noise
(Wilcoxon's signed-rank interval on the pairs' log ratios), within the pair budget, or twice that
while it is ahead on the median at all. A proof, as every plan's against the baseline: plain DDP is
the baseline the job would otherwise run, and the plan has not met it before. (A rule that kept B
while it was ahead on the median kept `shm` for the mlp's 2 MiB class in one job of three, at
0.982x over 12 pairs, interval 0.847-1.082, where it measured 1.018x and 1.051x in the two others
and 1.066x in a paired run: docs/BENCHMARKS.md.)

Kept, the plan runs through the hook, and its gain is this paired test's, against plain DDP. Lost,
the job runs plain DDP from there: it has unhooked (and DDP's bucket size is tuned next, as
after any unhook).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch.nn.parallel import DistributedDataParallel

from autotune.ddp.unhook import rebuild_reducer
from autotune.tuning.blocks import BLOCK, BlockTimer
from autotune.tuning.buckets import bucket_test
from autotune.tuning.paired_test import Outcome

__all__ = ["PlainCheck"]

_log = logging.getLogger("autotune")


class PlainCheck:
    """Runs the check against plain DDP on ``ddp`` from its forward pre-hook
    (`autotune.ddp.unhook.Unhooking` calls `pre_forward`), on every rank alike.

    ``settle()`` waits until the hook's last iteration is handled everywhere in this process
    (the engine idle, the tuner's listeners done); ``rehooked()`` is called after the hook is
    registered again on a new reducer (the next hooked step spans the blocks without it)."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        *,
        plan: str,
        settle: Callable[[], None],
        rehooked: Callable[[], None],
        max_pairs: int,
    ) -> None:
        hooks = list(getattr(ddp, "_comm_hooks", ()))
        if len(hooks) != 1:
            raise ValueError(f"the model holds {len(hooks)} comm hooks, not autotune's alone")
        self._hook, self._state = hooks[0]
        self._ddp = ddp
        self._plan = plan
        self._settle = settle
        self._rehooked = rehooked
        self._timer = BlockTimer(ddp)
        self._duel = bucket_test(max_pairs)
        #: Whether the reducer now has the hook (it has at the start).
        self.hooked = True
        #: How the paired test ended (None: not yet, or it stopped: `stopped` says why).
        self.outcome: Outcome | None = None
        self.stopped: str | None = None

    @property
    def over(self) -> bool:
        """Whether the check against plain DDP has ended: decided, or stopped."""
        return self.outcome is not None or self.stopped is not None

    @property
    def iterations(self) -> int:
        """Iterations the check against plain DDP has run so far."""
        return self._timer.iterations

    def pre_forward(self) -> bool:
        """Before a forward: time the step that just ended; at a block's end, decide, and put the
        next block's reducer in place. False once over: the reducer is then the one kept, and
        `hooked` says which."""
        if not self._timer.counts():
            return True
        first = self._timer.iterations == 0
        step = self._timer.tick()
        if step is not None:
            outcome = self._duel.measure(self.hooked, step)
            if outcome is not None:
                self.outcome = outcome
                self._report(outcome)
                self._switch(outcome.challenger_won)
                self._settle()  # the caller tells the tuner next
                return False
        if first or step is not None:  # a block begins
            return self._switch(self._duel.schedule())
        return True

    def _switch(self, hooked: bool) -> bool:
        """Put the reducer for ``hooked`` in place; False if that failed (the check against plain
        DDP stops, the reducer as it was). The hooked blocks are not made to wait for the engine's
        listeners (the training thread never does, `Engine._wait_for_plan`): only a switch does."""
        if hooked == self.hooked:
            return True
        self._settle()
        try:
            rebuild_reducer(self._ddp)
        except Exception as exc:
            self.stopped = f"rebuilding DDP's reducer failed: {exc!r}"
            _log.warning("autotune stops comparing its plan with plain DDP: %s", self.stopped)
            return False
        if hooked:
            self._ddp.register_comm_hook(self._state, self._hook)
            self._rehooked()
        self.hooked = hooked
        return True

    def _report(self, outcome: Outcome) -> None:
        g = outcome.gain
        _log.info(
            "autotune check against plain DDP: %s through the hook %s, %.3fx plain DDP's step "
            "(%d pairs of %d-iteration blocks, 95%% interval %.3f-%.3f): %s",
            self._plan,
            "kept" if outcome.challenger_won else "lost",
            g.ratio,
            g.pairs,
            BLOCK,
            g.low,
            g.high,
            outcome.why,
        )
