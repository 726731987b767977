"""A tuned `Table`: what a job stores and shows (per size class an `Entry`; the fusion size; the
measured `Gain`; a near miss, `NearMiss`; DDP's `Buckets`), to and from JSON, in lines a person
reads, and the plan file that runs one fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from autotune.plan.nccl_csv import nccl_csv
from autotune.plan.records import (
    STATES,
    Buckets,
    Entry,
    Gain,
    NearMiss,
    choice_json,
    read_choice,
    read_class,
)
from autotune.plan.render import PLAN_COLUMNS, aligned, plan_rows
from autotune.plan.runtime import BASELINE_CHOICE, check_fusion_bytes
from autotune.util.units import count, format_bytes

__all__ = ["Table", "load_table"]


@dataclass(frozen=True)
class Table:
    """A tuned plan as stored and exported: per size class an entry, the job's fusion size, the
    plan's measured step over the baseline's (None: not compared), where the baseline was kept,
    the plan that came closest to beating it (`NearMiss`; None: none came close), and where autotune
    unhooked, the bucket size DDP kept (`Buckets`; None: DDP's as the job built them)."""

    classes: dict[int, Entry]
    fusion_bytes: int | None = None
    fingerprint: dict[str, str | int] | None = None
    gain: Gain | None = None
    lead: NearMiss | None = None
    buckets: Buckets | None = None
    #: The model the plan was tuned for, in words a person reads (its class and parameter
    #: count: ``Net, 23,140 parameters``), where the job that stored it knew; None before.
    model: str | None = None
    #: Whether the job that stored it had decided (False: it ended while still tuning, and the
    #: next job resumes from it).
    final: bool = True
    #: Where it had not: the fusion sizes still to meet its plan (the next job meets them).
    fusion_left: tuple[int, ...] = ()
    #: Where it had not: its plan's step over the baseline's as the paired tests that put it in
    #: place measured it (`autotune.tuning.plan_search.PlanSearch.estimate`; None: not known),
    #: which the next job's check against plain DDP takes its block size from.
    estimate: float | None = None

    def __str__(self) -> str:
        """`lines`: what ``autotune show`` prints of a stored plan."""
        return "\n".join(self.lines())

    def step_line(self) -> str:
        """The plan's training step against plain DDP's, as the job measured it (below 1
        faster; a bucket size's where autotune unhooked onto one), and whether that job's
        decision was final."""
        buckets = self.buckets
        gain = buckets.gain if buckets is not None and buckets.gain else self.gain
        decided = "final" if self.final else "provisional: the next job resumes from it"
        if gain is None:
            if self.runs_native:
                return f"1.00x plain DDP's (its own all-reduce kept), {decided}"
            return f"not compared with plain DDP, {decided}"
        return (
            f"{gain.ratio:.2f}x plain DDP's ({count(gain.pairs, 'pair')}, 95% interval "
            f"{gain.interval()}), {decided}"
        )

    def lines(self, *, seed: bool = False) -> list[str]:
        """The table in lines a person reads (``autotune show``, ``print(state.table())``): the
        fusion size and `step_line`, then per size class its choice, screening's median, trials
        and state (`autotune.plan.render.plan_rows`), then the plan the next job tries again (a
        near miss) and the bucket size DDP kept. ``seed``: a sweep's screening, only the
        classes."""
        lines = []
        if not seed:
            fusion = format_bytes(self.fusion_bytes) if self.fusion_bytes else "DDP's buckets"
            if self.fusion_left:  # a provisional table's: the next job meets them
                left = ", ".join(format_bytes(b) for b in self.fusion_left)
                fusion += f" so far ({left} still to meet the plan)"
            lines.append(f"fusion: {fusion}; step: {self.step_line()}")
        rows = [(*cells, self.classes[cls].state) for cls, cells in plan_rows(self.classes)]
        named = max((len(r[1]) for r in rows), default=0)  # hierarchical_two_tree is 21
        widths = (10, -max(10, named), 9, 12, 6, -9)  # negative: left-aligned
        for cells in ((*PLAN_COLUMNS, "state"), *rows):
            lines.append(aligned(cells, widths).rstrip())
        if self.lead is not None:
            again = "again" if self.final else "again, with the plan's algorithms carried to it"
            lines.append(
                f"{self.lead.why()}; the next job tests it {again}: {self.lead.describe()}"
            )
        if self.buckets is not None:
            lines.append(f"unhooked onto {self.buckets.describe()}")
        return lines

    @property
    def runs_native(self) -> bool:
        """Whether every class runs the baseline: only then does a bucket size (`buckets`)
        apply, by unhooking; a plan with a Python-driven class keeps the hook."""
        return all(e.choice == BASELINE_CHOICE for e in self.classes.values())

    @property
    def runs_without_hook(self) -> bool:
        """Whether DDP runs every class without the hook once autotune unhooks: the baseline,
        or an algorithm the backend runs from the plan handed to it (`autotune.algorithms.
        carried`: autotune-nccl's cells, through NCCL's tuner plugin's table). Only then does a
        bucket size (`buckets`) apply."""
        from autotune.algorithms import carried

        return all(carried(e.choice) for e in self.classes.values())

    def to_json(self) -> dict[str, object]:
        described: dict[str, object] = {} if self.model is None else {"model": self.model}
        if not self.final:
            described["final"] = False
            described["fusion_left"] = list(self.fusion_left)
            if self.estimate is not None:
                described["estimate"] = self.estimate
        return {
            **described,
            "fingerprint": self.fingerprint,
            "fusion_bytes": self.fusion_bytes,
            "gain": None if self.gain is None else self.gain.to_json(),
            "lead": None if self.lead is None else self.lead.to_json(),
            "buckets": None if self.buckets is None else self.buckets.to_json(),
            "classes": {
                str(cls): {
                    **choice_json(e.choice),
                    "best_s": e.best_s,
                    "trials": e.trials,
                    "state": e.state,
                }
                for cls, e in sorted(self.classes.items())
            },
        }

    @classmethod
    def from_json(cls, data: object) -> Table:
        """Read `to_json`'s form back, checking every value the engine would run with.

        A ValueError says what is wrong and where: nothing in a table can reach the engine
        unchecked (a negative fusion size once silently turned off the all-reduce).
        """
        from autotune.algorithms import available

        if not isinstance(data, dict) or not isinstance(data.get("classes"), dict):
            raise ValueError("a plan table is a JSON object with a 'classes' object")
        names = available()
        classes: dict[int, Entry] = {}
        for key, raw in data["classes"].items():
            where = f"class {key!r}"
            size = read_class(key, where)
            choice = read_choice(raw, names, where)
            assert isinstance(raw, dict)
            trials = raw.get("trials", 0)
            best = raw.get("best_s")
            state = raw.get("state", "locked")
            if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
                raise ValueError(f"{where}: trials must be an int >= 0, got {trials!r}")
            if best is not None and (not _finite(best) or best < 0):
                raise ValueError(f"{where}: best_s must be seconds >= 0 or null, got {best!r}")
            if state not in STATES:
                raise ValueError(f"{where}: state must be one of {', '.join(STATES)}: {state!r}")
            classes[size] = Entry(choice, None if best is None else float(best), trials, state)
        fusion = data.get("fusion_bytes")
        check_fusion_bytes(fusion, "fusion_bytes")
        assert fusion is None or isinstance(fusion, int)
        fingerprint = data.get("fingerprint")
        gain, lead, buckets = data.get("gain"), data.get("lead"), data.get("buckets")
        if buckets is not None and not cls(classes).runs_without_hook:
            raise ValueError(
                "buckets: DDP's own bucket size is kept only where every class runs without the "
                "hook, native or an NCCL cell (autotune applies it by unhooking)"
            )
        model, final = data.get("model"), data.get("final", True)
        if model is not None and not isinstance(model, str):
            raise ValueError(f"model: expected a string or null, got {model!r}")
        if not isinstance(final, bool):
            raise ValueError(f"final: expected true or false, got {final!r}")
        left = data.get("fusion_left", [])
        if not isinstance(left, list) or any(
            isinstance(f, bool) or not isinstance(f, int) for f in left
        ):
            raise ValueError(f"fusion_left: expected a list of sizes in bytes, got {left!r}")
        for size in left:
            check_fusion_bytes(size, "fusion_left")
        estimate = data.get("estimate")
        if estimate is not None and (not _finite(estimate) or estimate <= 0):
            raise ValueError(f"estimate: expected a step ratio > 0 or null, got {estimate!r}")
        return cls(
            classes,
            fusion,
            fingerprint if isinstance(fingerprint, dict) else None,
            None if gain is None else Gain.from_json(gain),
            None if lead is None else NearMiss.from_json(lead),
            None if buckets is None else Buckets.from_json(buckets),
            model,
            final,
            tuple(left),
            None if estimate is None else float(estimate),
        )

    def nccl_csv(self, n_nodes: int = -1, n_ranks: int = -1) -> str:
        """The table as the NCCL example tuner plugin's CSV (`autotune.plan.nccl_csv`)."""
        return nccl_csv({cls: e.choice for cls, e in self.classes.items()}, n_nodes, n_ranks)


def _finite(value: object) -> TypeGuard[int | float]:
    """Whether a JSON value is a finite number (JSON's true and false are not)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def load_table(path: str) -> Table:
    """Read a table written by ``autotune show --json``; errors name the file and the problem."""
    from autotune.util.jsonfile import read_json

    return read_json(path, Table.from_json, "plan file")
