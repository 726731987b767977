"""The check against plain DDP: a locked plan that needs the hook, against DDP without it.

The plan search's paired tests run the baseline through the hook, so a plan that beat them may
still be slower than plain DDP, which the job runs once it unhooks (the hook costs a Python call
and a 1/N pass per bucket). So where a job may unhook, a plan that needs the hook is locked only
once `PlainCheck` has it beat plain DDP: the job's reducer without the hook (A) against a reducer
with the hook running the plan (B), in blocks of iterations, A B B A
(`autotune.tuning.blocks`; each switch rebuilds the reducer and registers the hook again for B),
judged as a first bucket test (`autotune.tuning.buckets.bucket_test`): B is kept only if it is
faster beyond noise. Kept, the plan runs through the hook and its gain is this test's; lost, the
job runs plain DDP from there (and DDP's bucket size is tuned next). A block is ``steps`` timed
steps: 4, or 1 where the plan's gain is clear (`autotune.tuning.blocks.check_steps_for`).
Measurements behind these rules: docs/TUNER.md and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch.nn.parallel import DistributedDataParallel

from autotune.ddp.reducer import rebuild_reducer
from autotune.tuning.blocks import BLOCK_STEPS, BlockTimer, blocks
from autotune.tuning.buckets import bucket_test
from autotune.tuning.paired_test import Outcome

__all__ = ["PlainCheck"]

_log = logging.getLogger("autotune")


class PlainCheck:
    """Runs the check against plain DDP on ``ddp`` from its forward pre-hook
    (`autotune.tuning.unhooked.Unhooking` calls `pre_forward`), on every rank alike.

    ``settle()`` waits until the hook's last iteration is handled everywhere in this process
    (the engine idle, the tuner's listeners done); ``rehooked()`` is called after the hook is
    registered again on a new reducer (the next hooked step spans the blocks without it);
    ``steps``: timed steps per block."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        *,
        plan: str,
        settle: Callable[[], None],
        rehooked: Callable[[], None],
        max_pairs: int,
        steps: int = BLOCK_STEPS,
    ) -> None:
        hooks = list(getattr(ddp, "_comm_hooks", ()))
        if len(hooks) != 1:
            raise ValueError(f"the model holds {len(hooks)} comm hooks, not autotune's alone")
        self._hook, self._state = hooks[0]
        self._ddp = ddp
        self._plan = plan
        self._settle = settle
        self._rehooked = rehooked
        self._timer = BlockTimer(ddp, steps=steps)
        self._duel = bucket_test(max_pairs, signed_rank=steps > 1)  # a single step: sign test
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

    def iterations_left(self) -> int:
        """Iterations before the check decides, roughly (its paired test to its ``max_pairs``,
        `PairedTest.measurements_left`; 0 once over)."""
        if self.over:
            return 0
        return self._duel.measurements_left() * self._timer.most_iterations

    def restart(self) -> None:
        """Begin the block under way again (`BlockTimer.restart`)."""
        self._timer.restart()

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
        listeners (the training thread never does, `Progress.wait_for_plan`): only a switch does."""
        if hooked == self.hooked:
            return True
        self._settle()
        try:
            rebuild_reducer(self._ddp)
        except Exception as exc:
            self.stopped = f"rebuilding DDP's reducer failed: {exc!r}"
            _log.warning("autotune stops comparing its plan with plain DDP: %s", self.stopped)
            return False
        self._timer.renewed()
        if hooked:
            self._ddp.register_comm_hook(self._state, self._hook)
            self._rehooked()
        self.hooked = hooked
        return True

    def _report(self, outcome: Outcome) -> None:
        g = outcome.gain
        _log.info(
            "autotune check against plain DDP: %s through the hook %s, %.3fx plain DDP's step "
            "(%d pairs of %s, 95%% interval %.3f-%.3f): %s",
            self._plan,
            "kept" if outcome.challenger_won else "lost",
            g.ratio,
            g.pairs,
            blocks(self._timer.steps),
            g.low,
            g.high,
            outcome.why,
        )
