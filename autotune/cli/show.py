"""``autotune show`` and ``autotune forget``: the tuned plans in the storage, read and forgotten."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.plan import Table

__all__ = ["forget", "show"]


def show(args: argparse.Namespace) -> int:
    import json

    from autotune.storage import EARLIER, SWEEP, Store, storage_url
    from autotune.util.redact import redact_url
    from autotune.util.units import format_bytes

    seeds = {
        SWEEP: "a sweep's screening: seeds every job's search",
        EARLIER: "stored before plans were kept per job: seeds every job's search",
    }

    try:
        url = storage_url(args.storage, create=False)  # read only: never make a database
        stored = Store(url).tables()
    except (
        ValueError
    ) as exc:  # the storage's own error, its password masked (autotune.storage.store)
        print(f"autotune show: {exc}", file=sys.stderr)
        return 1
    url = redact_url(url)
    tables = {f"{key}/{workload}": table for (key, workload), table in stored.items()}
    if not (args.json or args.nccl_csv):
        print(f"storage: {url}")
    if args.key:
        picked = _pick(tables, args.key)
        if not picked:
            known = ", ".join(tables) or "none"
            print(
                f"autotune show: no plan {args.key!r} in {url} (stored: {known})", file=sys.stderr
            )
            return 2
        tables = picked
    if (args.json or args.nccl_csv) and len(tables) != 1:
        print(
            f"autotune show: {len(tables)} plans in {url} ({', '.join(tables) or 'none'}); pick "
            "one with --key KEY/WORKLOAD to export it",
            file=sys.stderr,
        )
        return 2
    if not tables:
        print(f"no tuned plans in {url}")
        return 0
    for name, table in tables.items():
        fp = table.fingerprint or {}
        where = ", ".join(f"{k}={v}" for k, v in fp.items())
        workload = name.split("/", 1)[1]
        if workload in seeds:
            print(f"plan {name} ({seeds[workload]}): {where}")
        else:
            fusion = "DDP's buckets" if not table.fusion_bytes else format_bytes(table.fusion_bytes)
            model = "" if table.model is None else f" ({table.model})"
            print(f"plan {name}{model}: {where}; fusion: {fusion}")
            print(f"  step: {_step_line(table)}")
        head = f"{'size class':>10}  {'algorithm':<10} {'segment':>9} {'best':>10}"
        print(f"  {head} {'trials':>6}  state")
        for cls, e in sorted(table.classes.items()):
            seg = format_bytes(e.choice.segment_bytes) if e.choice.segment_bytes else "default"
            best = f"{e.best_s * 1e3:.2f}ms" if e.best_s is not None else "-"
            print(
                f"  {format_bytes(cls):>10}  {e.choice.label:<10} {seg:>9} {best:>10} "
                f"{e.trials:>6}  {e.state}"
            )
        if table.lead is not None:
            again = "again" if table.final else "again, with the plan's algorithms carried to it"
            print(
                f"  ahead but not beyond noise; the next job tests it {again}: "
                f"{table.lead.describe()}"
            )
        if table.buckets is not None:
            print(f"  unhooked onto {table.buckets.describe()}")
    if not (args.json or args.nccl_csv):
        return 0
    table = next(iter(tables.values()))  # exactly one, checked above
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table.to_json(), f, indent=2)
        print(f"wrote {args.json} (load it with Config(plan_file=...))")
    if args.nccl_csv:
        fp = table.fingerprint or {}
        csv = table.nccl_csv(int(fp.get("nodes", -1)), int(fp.get("world_size", -1)))
        with open(args.nccl_csv, "w") as f:
            f.write(csv)
        print(f"wrote {args.nccl_csv} (for NCCL_TUNER_CONFIG_FILE)")
    return 0


def _pick(tables: dict[str, Table], key: str) -> dict[str, Table]:
    """The plans ``key`` names: KEY/WORKLOAD, a fingerprint KEY (every workload's plan under it),
    or a WORKLOAD (under any key)."""
    return {n: t for n, t in tables.items() if key in (n, *n.split("/", 1))}


def _step_line(table: Table) -> str:
    """The stored plan's training step against plain DDP's, as the job that stored it measured
    it (below 1 faster), and whether that job's decision was final."""
    from autotune.util.units import count

    gain = table.buckets.gain if table.buckets is not None and table.buckets.gain else table.gain
    decided = "final" if table.final else "provisional: the next job resumes from it"
    if gain is None:
        if table.runs_native:
            return f"1.00x plain DDP's (its own all-reduce kept), {decided}"
        return f"not compared with plain DDP, {decided}"
    return (
        f"{gain.ratio:.2f}x plain DDP's ({count(gain.pairs, 'pair')}, 95% interval "
        f"{gain.interval()}), {decided}"
    )


def forget(args: argparse.Namespace) -> int:
    from autotune.storage import Store, storage_url
    from autotune.util.redact import redact_url

    try:
        url = storage_url(args.storage, create=False)
        store = Store(url)
        stored = store.tables()
    except ValueError as exc:
        print(f"autotune forget: {exc}", file=sys.stderr)
        return 1
    tables = {f"{key}/{workload}": table for (key, workload), table in stored.items()}
    picked = _pick(tables, args.plan)
    if not picked:
        known = ", ".join(tables) or "none"
        print(
            f"autotune forget: no plan {args.plan!r} in {redact_url(url)} (stored: {known})",
            file=sys.stderr,
        )
        return 2
    for name in picked:
        key, workload = name.split("/", 1)
        runs = store.forget(key, workload)
        whose = "1 run's plan" if runs == 1 else f"{runs} runs' plans"
        print(f"forgot plan {name} ({whose}): its next job tunes from scratch")
    return 0
