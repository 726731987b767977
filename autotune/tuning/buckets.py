"""DDP's own bucket size, tuned once autotune has unhooked.

Where the tuner keeps a plan DDP can run itself (the backend's all-reduce for every class) and
the fusion size is its to choose (``Config.fusion_bytes`` None), autotune unhooks
(`autotune.tuning.unhooked`) and `BucketTuner` compares bucket sizes on DDP's own reducer, without
the hook, since DDP fuses gradients into its buckets for free where the hook's fusion costs a
copy (docs/BENCHMARKS.md, "DDP's bucket size"):

- the reference is the reducer as the job built it (its ``bucket_cap_mb``): plain DDP itself;
- the challengers (`challengers`): the fusion size the tuner kept, then the reference's
  neighbours in `LADDER`, each only if it changes the bucket layout (`layout`);
- each meets the reference in blocks (`autotune.tuning.blocks`), A B B A (`bucket_test`:
  Wilcoxon's signed-rank interval, up to `MAX_PAIRS` pairs, twice that while ahead); a switch
  rebuilds the reducer;
- the fastest that won beyond noise is kept, else the reference; a near miss is stored as the
  lead. The next job re-checks a stored size (`PairedTest(hold=True)`) instead of searching.

Every rank runs the same schedule and decides alike on the same numbers (`autotune.tuning.blocks`),
so the ranks rebuild their reducers before the same iteration without any orders. Nothing is
re-checked in the job once decided: without the hook nothing is measured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from autotune.ddp.reducer import (
    rebuild_reducer,
    restore_bucket_config,
    saved_bucket_config,
    set_bucket_cap,
)
from autotune.plan import Buckets
from autotune.tuning.blocks import BLOCKS, BlockTimer
from autotune.tuning.paired_test import FUTILE_FROM, MIN_PAIRS, Outcome, PairedTest
from autotune.tuning.plan_search import NEAR_MISS_BELOW
from autotune.util.units import format_bytes

__all__ = [
    "LADDER",
    "BucketSearch",
    "BucketTuner",
    "bucket_test",
    "challengers",
    "layout",
]

_log = logging.getLogger("autotune")

#: Bucket caps tried against the job's own (bytes).
LADDER = (1 << 20, 4 << 20, 16 << 20, 64 << 20)
#: Most pairs of blocks a bucket paired test runs (fewer where ``Config.max_pairs`` says so): a pair
#: of blocks is 2 x 6 timed iterations, each block's median steadier than one iteration's step.
MAX_PAIRS = 12
#: A first bucket paired test goes on to twice `MAX_PAIRS` for a challenger ahead on the median at
#: all, not only at the hooked paired tests' `PROMISING` (0.95): both arms are DDP's own reducer,
#: so pairs spent on a challenger that is ahead cost the job little more than the rebuilds, while
#: on a shared machine a real gain can end `MAX_PAIRS` pairs only a little ahead, unproven, and
#: be lost.
EXTEND_BELOW = 1.0


def challengers(
    reference: int, total: int, first: int | None = None, first_bucket: int | None = None
) -> list[int]:
    """The caps to try against ``reference`` (bytes) for ``total`` bytes of gradients: ``first``
    (the tuner's fusion size), then `LADDER`'s neighbours of the reference, the next size up and
    the next down, without those that repeat a layout. A layout is the first bucket and the size
    of the rest: at or above ``total`` every cap makes one bucket, and DDP's default (25 MiB)
    starts with a 1 MiB bucket (``first_bucket``; None: as large as the others), so 1 MiB
    buckets on a 1.5 MB model are the default's own layout. Neighbours only: each paired test costs
    100-400 iterations, and a size two steps away rarely wins where the next one loses."""

    now = min(reference, total)
    up = next((c for c in sorted(LADDER) if min(c, total) > now), None)
    down = next((c for c in sorted(LADDER, reverse=True) if c < now), None)
    seen = {layout(reference, total, first_bucket)}
    out = []
    for cap in (first, up, down):
        if cap and layout(cap, total) not in seen:
            seen.add(layout(cap, total))
            out.append(cap)
    return out


def layout(cap: int, total: int, first_bucket: int | None = None) -> tuple[int, int]:
    """What DDP's buckets of ``cap`` bytes (the first one of ``first_bucket``; None: ``cap``)
    make of ``total`` bytes of gradients, as far as the search tells layouts apart: the first
    bucket's size, and the largest of the rest's."""
    head = min(first_bucket or cap, total)
    return head, min(cap, total - head)


def bucket_test(
    max_pairs: int = MAX_PAIRS, recheck: bool = False, signed_rank: bool = True
) -> PairedTest:
    """The paired test of one challenger against the reference, in pairs of blocks: a first paired
    test goes on to twice ``max_pairs`` while ahead on the median at all (`EXTEND_BELOW`); a
    re-check of a stored size (``recheck``) is judged on the median at ``max_pairs``, and again at
    twice that where it was not ahead (``PairedTest(hold=True)``). ``signed_rank``: blocks'
    medians, whose tails are cut, are judged on Wilcoxon's signed-rank interval; blocks of one
    timed step are single steps, long-tailed and skewed, and take the sign test as the paired
    tests of steps do (`PairedTest`)."""
    return PairedTest(
        max_pairs,
        warmup=0,
        extend_to=2 * max_pairs,
        signed_rank=signed_rank,
        hold=recheck,
        promising=EXTEND_BELOW,
    )


class BucketSearch:
    """Which cap each block runs, and the verdict; the same on every rank given the same steps.

    ``reference``: the job's own cap. ``stored``: the cap a previous job kept over it (first, a
    re-check; if it holds, kept at once); ``candidates``: the rest, each tested against the
    reference in turn. ``lead``: where nothing is stored, the cap that came close in the job
    before (`result`'s lead): tested once more, alone (won: kept; lost: forgotten)."""

    def __init__(
        self,
        reference: int,
        candidates: Sequence[int],
        stored: int | None = None,
        max_pairs: int = MAX_PAIRS,
        lead: int | None = None,
        as_stored: bool = False,
    ) -> None:
        self.reference = reference
        #: The job's own buckets kept because a previous job kept them (nothing to test but
        #: its lead, if any); else, with nothing queued, no candidate changes the layout.
        self.as_stored = as_stored
        self.stored = stored if stored != reference else None
        self.retry = lead if self.stored is None and lead not in (None, reference) else None
        if self.retry is not None:
            self._queue = [self.retry]
        else:
            self._queue = [c for c in candidates if c != self.stored]
            if self.stored is not None:
                self._queue.insert(0, self.stored)
        self.max_pairs = max(MIN_PAIRS, max_pairs)
        #: Each challenger's cap and how its paired test ended.
        self.history: list[tuple[int, Outcome]] = []
        self.kept: int | None = None  # decided: the cap kept (the reference if none won)
        self._duel: PairedTest | None = None
        self._next = self._start_next()

    def _start_next(self) -> int | None:
        """The cap the next block runs, opening the next paired test where one is due; None:
        done."""
        if self._duel is None:
            if not self._queue:
                self._decide()
                return None
            # Proven in a job before: a re-check.
            self._duel = bucket_test(self.max_pairs, recheck=self._queue[0] == self.stored)
        return self._queue[0] if self._duel.schedule() else self.reference

    @property
    def done(self) -> bool:
        return self.kept is not None

    def cap(self) -> int | None:
        """The cap the next block runs (None: the search is over; `kept` says what stays)."""
        return self._next

    def block(self, step_s: float) -> None:
        """The block that ran `cap()` took ``step_s`` a step (median, slowest rank)."""
        duel, cap = self._duel, self._next
        assert duel is not None and cap is not None, "no block was due"
        outcome = duel.measure(cap != self.reference, step_s)
        if outcome is not None:
            challenger = self._queue.pop(0)
            self.history.append((challenger, outcome))
            self._duel = None
            if outcome.challenger_won and challenger == self.stored:
                self._queue.clear()  # the stored size holds: nothing else to try
        self._next = self._start_next()

    def _decide(self) -> None:
        won = [(o.gain.ratio, cap) for cap, o in self.history if o.challenger_won]
        self.kept = min(won)[1] if won else self.reference

    def result(self) -> Buckets | None:
        """The kept cap, with its gain over the reference where it is not the reference's own
        (gain None: the reference stays, with its lead: the cap that lost closest, ahead by
        `NEAR_MISS_BELOW` or more, unless this search was a lead's retry); None until decided."""
        if self.kept is None:
            return None
        if self.kept == self.reference:
            near = [
                (o.gain.ratio, Buckets(cap, o.gain))
                for cap, o in self.history
                if not o.challenger_won and o.gain.ratio < NEAR_MISS_BELOW
            ]
            if self.retry is not None or not near:
                return Buckets(self.reference, None)
            return Buckets(self.reference, None, min(near, key=lambda n: n[0])[1])
        gain = next(o.gain for cap, o in self.history if cap == self.kept)
        return Buckets(self.kept, gain)

    def blocks_left(self) -> int:
        """Blocks before the search decides, roughly: the paired test under way to its
        ``max_pairs``, each queued one at `FUTILE_FROM` pairs (0 once decided)."""
        if self.done:
            return 0
        queued = len(self._queue) - (self._duel is not None)
        n = 0 if self._duel is None else self._duel.measurements_left()
        return n + max(0, queued) * 2 * FUTILE_FROM

    @property
    def pairs(self) -> int:
        """Pairs of blocks run so far, over every paired test."""
        return sum(o.gain.pairs for _, o in self.history) + (
            len(self._duel.ratios) if self._duel is not None else 0
        )


def why_not_tuned(ddp: DistributedDataParallel) -> str | None:
    """Why DDP's bucket size is not tuned on ``ddp``, or None."""
    config = getattr(ddp, "_bucket_config", None)
    if config is not None and len(getattr(config, "per_bucket_bytes_caps", ())) > 0:
        return "the model sets its buckets one by one (bucket_cap_mb_list)"
    if getattr(ddp, "_use_python_reducer", False):
        return "DDP's Python reducer"
    return None


class BucketTuner:
    """Runs a `BucketSearch` on a DDP model that has unhooked, from its forward pre-hook.

    `Unhooking` calls `pre_forward` before each forward once the reducer is DDP's own; it
    returns False once the search is over. ``first``: the fusion size the tuner kept (None:
    none); ``stored``: the size a previous job kept (rank 0 knows it; every rank gets it at the
    first forward aside); ``on_done(kept)`` is called on every rank once it has decided, the
    reducer rebuilt for the kept size."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        *,
        first: int | None,
        stored: Callable[[], Buckets | None],
        on_done: Callable[[Buckets], None],
        max_pairs: int = MAX_PAIRS,
    ) -> None:
        self._ddp = ddp
        self._first = first
        self._stored = stored
        self._on_done = on_done
        self._max_pairs = max_pairs
        self._reference = saved_bucket_config(ddp)
        self.reference_cap = int(ddp.bucket_bytes_cap)
        self.total = int(
            sum(p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad)
        )
        self.search: BucketSearch | None = None
        self.running = self.reference_cap  # the cap the reducer has now
        self._timer = BlockTimer(ddp)

    @property
    def iterations(self) -> int:
        """Forwards (synced, with grad) since the search began; its cost's measure."""
        return self._timer.iterations

    @property
    def done(self) -> bool:
        """Whether the search has decided (and the reducer has the kept size)."""
        return self.search is not None and self.search.done

    def restart(self) -> None:
        """Begin the block under way again (`BlockTimer.restart`)."""
        self._timer.restart()

    def iterations_left(self) -> int | None:
        """Iterations before the search decides, roughly (`BucketSearch.blocks_left`); None
        before its first forward, where it learns what a previous job stored."""
        if self.search is None:
            return None
        return self.search.blocks_left() * self._timer.most_iterations

    def pre_forward(self) -> bool:
        """Before a forward: time the step that just ended; at a block's end, decide the next
        block's cap and rebuild the reducer for it. False once the search is over."""
        if not self._timer.counts():
            return True  # not an iteration that all-reduces (eval, or under no_sync)
        if self.search is None:
            self.search = self._begin()
            if self.search.done:
                return self._finish()
        step = self._timer.tick()
        return True if step is None else self._block_end(step)

    def _begin(self) -> BucketSearch:
        """At the first forward aside, on every rank: what a previous job stored (rank 0 knows
        it), and the search. A stored size that makes the job's own layout is the job's: kept
        as it is, or its lead tested once more. A stored size without a gain that is not the
        job's own (the job's cap has changed since) proves nothing here: a search as in a
        first job."""
        stored = self._stored()
        row = [0.0, 0.0, 0.0]
        if stored is not None:
            lead = stored.lead
            row = [
                float(stored.bucket_bytes),
                float(stored.gain is not None),
                0.0 if lead is None else float(lead.bucket_bytes),
            ]
        size, proven, lead_bytes = (int(v) for v in self._timer.most(row))
        head = _first_bucket(self._ddp)
        own = layout(self.reference_cap, self.total, head)

        def is_own(cap: int) -> bool:
            return cap == self.reference_cap or layout(cap, self.total) == own

        if size and is_own(size):
            retry = lead_bytes if lead_bytes and not is_own(lead_bytes) else None
            return BucketSearch(
                self.reference_cap, [], None, self._max_pairs, lead=retry, as_stored=True
            )
        candidates = challengers(self.reference_cap, self.total, self._first, head)
        kept = size if size and proven else None
        return BucketSearch(self.reference_cap, candidates, kept, self._max_pairs)

    def _block_end(self, step_s: float) -> bool:
        search = self.search
        assert search is not None
        told = len(search.history)
        search.block(step_s)
        for cap, outcome in search.history[told:]:
            g = outcome.gain
            _log.info(
                "autotune bucket paired test: DDP's buckets at %s %s, %.3fx the step with the "
                "job's own %s (%d pairs of blocks, 95%% interval %.3f-%.3f): %s",
                format_bytes(cap),
                "won" if outcome.challenger_won else "lost",
                g.ratio,
                format_bytes(self.reference_cap),
                g.pairs,
                g.low,
                g.high,
                outcome.why,
            )
        nxt = search.cap()
        if nxt is None:
            return self._finish()
        self._run(nxt)
        return True

    def _run(self, cap: int) -> None:
        if cap == self.running:
            return
        ddp = self._ddp
        if cap == self.reference_cap:
            restore_bucket_config(ddp, self._reference)
        else:
            set_bucket_cap(ddp, cap)
        rebuild_reducer(ddp)
        self._timer.renewed()
        self.running = cap

    def _finish(self) -> bool:
        search = self.search
        assert search is not None and search.kept is not None
        self._run(search.kept)
        result = search.result()
        assert result is not None
        if result.gain is not None:
            g = result.gain
            _log.info(
                "autotune kept DDP's buckets at %s: %.3fx the step with the job's own %s "
                "(%d pairs of %s, 95%% interval %.3f-%.3f)",
                format_bytes(result.bucket_bytes),
                g.ratio,
                format_bytes(self.reference_cap),
                g.pairs,
                BLOCKS,
                g.low,
                g.high,
            )
        elif search.history:
            _log.info(
                "autotune kept DDP's buckets as the job built them (%s): no bucket size beat "
                "them over %d pairs of %s%s",
                format_bytes(self.reference_cap),
                search.pairs,
                BLOCKS,
                ""
                if result.lead is None
                else f"; the next job gives {result.lead.describe()} one more paired test",
            )
        self._on_done(result)
        return False


def _first_bucket(ddp: DistributedDataParallel) -> int:
    """The first bucket's size in DDP's layout as the job built it (DDP's default: 1 MiB)."""
    config = getattr(ddp, "_bucket_config", None)
    if config is not None:
        return int(config.first_bucket_bytes_cap)
    if getattr(ddp, "bucket_bytes_cap_default", False):
        return int(dist._DEFAULT_FIRST_BUCKET_BYTES)
    return int(ddp.bucket_bytes_cap)
