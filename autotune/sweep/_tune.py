"""Offline tuning: per size class, an Optuna search over algorithm x segment, measured as the sweep
measures, and stored where and as the live tuner stores plans, so a job starts from it.

All of a class's trials are asked at once and measured interleaved, iteration by iteration, so a
slow spell on a shared machine hits every candidate alike instead of sinking whichever ran then.
The finalists, those within `FINAL_WITHIN` of the fastest, are then timed again, interleaved, for
`FINAL_ROUNDS` times as many iterations, and the choice is made on all of their samples: a few
iterations do not tell apart choices a few percent from each other, and the sweep's own rows
are then the judge of what was chosen.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from autotune.comm.topology import Topology
from autotune.plan import Choice, Entry, Table
from autotune.storage import SWEEP, Store, fingerprint_key, job_fingerprint, tell
from autotune.sweep._measure import Bench, Measured, Variant
from autotune.tuning.sampler import ask, open_study
from autotune.tuning.space import params_of, search_space, space_tag, suggest_choice

__all__ = [
    "FINALISTS",
    "FINAL_ROUNDS",
    "FINAL_WITHIN",
    "Tuned",
    "class_trials",
    "final_calls",
    "finalists",
    "time_choices",
    "tune",
]

#: Choices whose median is within this factor of the fastest's are timed again before one is
#: chosen (on this project's 2-core machine and emulated cluster, the median of 10 iterations of
#: one choice moves by 5-10% between two runs of it).
FINAL_WITHIN = 1.1
#: At most this many finalists, the fastest first.
FINALISTS = 4
#: The finalists' second timing runs this many times the sweep's iterations.
FINAL_ROUNDS = 2


@dataclass
class Tuned:
    """What tuning chose per size class (every rank), and, on rank 0, the stored table."""

    choices: dict[int, Choice]
    table: Table | None = None
    key: str | None = None


def class_trials(cls: int, candidates: Sequence[str], budget: int, topo: Topology) -> int:
    """How many trials a class gets: its whole space, or the budget if smaller."""
    return min(budget, len(search_space(cls, candidates, topo)))


def final_calls(iters: int, warmup: int) -> int:
    """The most calls a class's final timing makes (for a progress bar's total)."""
    return FINALISTS * (warmup + FINAL_ROUNDS * iters)


def finalists(medians: Sequence[float]) -> list[int]:
    """The indices timed again: within `FINAL_WITHIN` of the fastest, fastest first; none when
    only one is that close."""
    ranked = sorted(range(len(medians)), key=lambda j: medians[j])
    if not ranked:
        return []
    limit = FINAL_WITHIN * medians[ranked[0]]
    close = [j for j in ranked if medians[j] <= limit][:FINALISTS]
    return close if len(close) > 1 else []


class _Measures(Protocol):
    def progress(self, n: int) -> None: ...

    def measure(
        self, count: int, variants: Sequence[Variant], *, iters: int, warmup: int, check: int
    ) -> Measured: ...


def time_choices(
    bench: _Measures, count: int, variants: Sequence[Variant], iters: int, warmup: int
) -> tuple[list[list[float]], list[int]]:
    """Per variant, its timed samples (the finalists' second timing added) and wrong elements.

    Collective: every rank holds the same MAX-reduced times, so every rank times the same
    finalists. A variant that sums wrong is never a finalist.
    """
    # Always checked: a choice that sums wrong must never reach a job's plan.
    measured = bench.measure(count, variants, iters=iters, warmup=warmup, check=1)
    assert measured.wrong is not None
    wrong = measured.wrong
    samples = [[row[j] for row in measured.seconds] for j in range(len(variants))]
    right = [j for j in range(len(variants)) if wrong[j] == 0]
    final = [right[k] for k in finalists([statistics.median(samples[j]) for j in right])]
    if final:
        more = bench.measure(
            count, [variants[j] for j in final], iters=FINAL_ROUNDS * iters, warmup=warmup, check=0
        )
        for k, j in enumerate(final):
            samples[j] += [row[k] for row in more.seconds]
    bench.progress(final_calls(iters, warmup) - len(final) * (warmup + FINAL_ROUNDS * iters))
    return samples, wrong


def tune(
    bench: Bench,
    classes: Sequence[int],
    candidates: Sequence[str],
    *,
    budget: int,
    iters: int,
    warmup: int,
    storage: str,
    topo: Topology,
    on_class: Callable[[int, Entry | None], None] | None = None,
) -> Tuned:
    """Tune each size class in ``classes`` (collective over the bench's group)."""
    import optuna

    rank = dist.get_rank(bench.group)
    store: Store | None = None
    fp = job_fingerprint(bench.group, bench.device, bench.dtype, topo)
    key = fingerprint_key(fp)
    if rank == 0:
        store = Store(storage)
    choices: dict[int, Choice] = {}
    entries: dict[int, Entry] = {}
    elem = bench.dtype.itemsize
    for cls in classes:
        space = search_space(cls, candidates, topo)
        k = class_trials(cls, candidates, budget, topo)
        codes = torch.zeros(k, dtype=torch.int64, device=bench.book_device)
        trials: list[optuna.Trial] = []
        study: optuna.Study | None = None
        if store is not None:
            # The space's first k options, in its order (every option while the budget allows).
            study = open_study(store, key, f"sweep/class={cls}/{space_tag(space)}")
            store.fail_stale_trials(study)
            suggest = functools.partial(suggest_choice, space=space)
            trials = [ask(study, space[i], params_of(space[i]), suggest) for i in range(k)]
            for t in trials:
                store.started(t)  # heartbeats: no other job takes them for a dead job's
            codes = torch.arange(k, dtype=torch.int64, device=bench.book_device)
        bench.broadcast(codes)
        picked = list(dict.fromkeys(int(c) for c in codes.tolist()))  # distinct, in order
        variants = [Variant(f"#{i}", space[i].algorithm, space[i].segment_bytes) for i in picked]
        samples, wrong = time_choices(bench, max(cls // elem, 1), variants, iters, warmup)
        medians = {i: statistics.median(samples[j]) for j, i in enumerate(picked)}
        # Every rank holds the same MAX-reduced times, so every rank picks the same best.
        good = {i: medians[i] for j, i in enumerate(picked) if wrong[j] == 0}
        if study is not None:
            assert store is not None
            for trial, code in zip(trials, codes.tolist(), strict=True):
                wrong_elements = wrong[picked.index(code)]
                failure = f"{wrong_elements} wrong elements over ranks" if wrong_elements else None
                tell(study, trial, None if wrong_elements else medians[code], failure)
                store.told(trial)
            store.beat()
        entry = None
        if good:
            best = min(good, key=lambda i: good[i])
            choices[cls] = space[best]
            entry = entries[cls] = Entry(space[best], good[best], k, "locked")
        if on_class is not None:
            on_class(cls, entry)
    if store is None:
        return Tuned(choices)
    # The sweep's classes replace those an earlier sweep stored; the others stay. Jobs' plans are
    # their own (each its workload's): the sweep's classes seed their searches, never replace them.
    old = store.load_table(key, SWEEP)
    merged = {**(old.classes if old else {}), **entries}
    table = Table(merged, None, fp)
    store.save_table(key, SWEEP, table)
    return Tuned(choices, table, key)
