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
        seed = workload in seeds
        if seed:
            print(f"plan {name} ({seeds[workload]}): {where}")
        else:
            model = "" if table.model is None else f" ({table.model})"
            print(f"plan {name}{model}: {where}")
        for line in table.lines(seed=seed):
            print(f"  {line}")
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
