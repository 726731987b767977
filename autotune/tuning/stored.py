"""What a job finds stored for its fingerprint and workload (`read_stored`): the plan an earlier
run of the same workload locked, the classes a sweep screened (the seed) and the prior a sweep
fitted; the part of a stored plan this job can run (`stored_arm`), a sweep's screening of a
class it can take (`seeded`), and what a job that has not decided yet stores (`provisional`).

The tuner reads them at its first exchange, on rank 0's worker thread. It confirms its own
workload's plan against the baseline before it locks it; a seed's classes stand in for their
screening, and their choices meet the baseline in the job's own search (docs/TUNER.md,
"Persistence").
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.model import Prior
from autotune.plan import Arm, Choice, NearMiss, Table
from autotune.storage import Store

__all__ = ["Stored", "provisional", "read_stored", "seeded", "stored_arm"]


@dataclass(frozen=True)
class Stored:
    """What the storage holds for a job: ``table``, its workload's plan; ``seed``, the classes a
    sweep screened (and plans older than workloads); ``prior``, the cost model's fit."""

    table: Table | None
    seed: Table | None
    prior: Prior | None


def read_stored(store: Store, key: str, workload: str) -> Stored:
    """What is stored for fingerprint ``key`` and ``workload`` (an unreadable prior is no prior:
    tuning goes on without one). First fails the trials that jobs now gone left running in any
    of the fingerprint's studies: a job that only runs the stored plan may never open those
    studies itself."""
    store.fail_stale(key)
    table = store.load_table(key, workload)
    seed = store.load_seed(key) if table is None else None
    raw = store.load_prior(key)
    prior = None
    if raw is not None:
        with contextlib.suppress(ValueError):
            prior = Prior.from_json(raw)
    return Stored(table, seed, prior)


def stored_arm(
    table: Table,
    baseline: Arm,
    runnable: Callable[[int, Choice], bool],
    fusion_options: Sequence[int] | None,
) -> Arm | None:
    """The plan ``table`` holds, as far as this job can run it: its locked classes whose choice
    ``runnable`` accepts, and its fusion size where this job tunes one among ``fusion_options``
    (None: it does not). None where that is the baseline with a measured gain: nothing to
    confirm."""
    choices = {
        cls: e.choice
        for cls, e in table.classes.items()
        if e.state == "locked" and runnable(cls, e.choice)
    }
    fusion = baseline.fusion_bytes
    if fusion_options is not None and table.fusion_bytes in fusion_options:
        fusion = table.fusion_bytes or 0
    if choices or fusion != baseline.fusion_bytes or table.gain is None:
        return Arm.of(choices, fusion)
    return None


def seeded(seed: Table, cls: int, space: Sequence[Choice]) -> tuple[Choice, float] | None:
    """A sweep's screening of ``cls`` in ``seed`` (its best choice and latency), where it
    locked one this job can run (in ``space``); None otherwise."""
    entry = seed.classes.get(cls)
    if entry is None or entry.state != "locked" or entry.best_s is None:
        return None
    if entry.choice not in space:
        return None
    return entry.choice, entry.best_s


def provisional(
    table: Table,
    incumbent: Arm,
    fusion_near: NearMiss | None = None,
    tested: bool = False,
    fusion_left: Sequence[int] = (),
    estimate: float | None = None,
) -> Table:
    """What a job stores before it has decided (`Table.final` False), so that one that ends
    first leaves the next a place to resume: the plan that has won so far (``incumbent``, whose
    choices ``table`` holds: `autotune.tuning.decider.Decider.table`; its classes locked, the
    rest exploring, or all locked once the class tests are over: ``tested``), its gain so
    far, its fusion size and those still to meet it (``fusion_left``: the next job meets
    them), and as its lead the fusion size that came close and has yet to meet the plan again
    (``fusion_near``: `autotune.tuning.fusion_stage.FusionStage`), and the plan's ``estimate``
    (`autotune.tuning.plan_search.PlanSearch.estimate`: the next job's check takes its block
    size from it)."""
    won = incumbent.as_dict()
    classes = {
        cls: dataclasses.replace(e, state="locked" if tested or cls in won else "exploring")
        for cls, e in table.classes.items()
    }
    return dataclasses.replace(
        table,
        classes=classes,
        fusion_bytes=incumbent.fusion_bytes,
        lead=fusion_near,
        final=False,
        fusion_left=tuple(fusion_left),
        estimate=estimate,
    )
