"""The step-gain guard: what autotune pays three models' training step, against what it paid before.

    make bench             # = python benchmarks/guard.py
    make bench RECORD=1    # = python benchmarks/guard.py --record: the figures become the record

Run it before finishing any change to the engine, the tuner, the algorithms or the hook. For the
example's MLP, the transformer and the convnet (`benchmarks/step_gain.py`'s three shapes), at 4
spawned CPU ranks with one thread each, it tunes from an empty storage, restarts on that storage,
then steps plain DDP, `noop_hook` and autotune in turns (`step_gain.cell`), about 15 minutes on
a 2-core machine. It prints one table: each model's autotune / plain DDP ratio (median of
per-step ratios, the sign test's 95% interval), the `noop_hook` headroom, the share of it
autotune took, what it kept, and the recorded figure beside it, then a breakdown of where the
autotune step goes (`step_gain.py --breakdown`).

A ratio is flagged where its median is above the recorded interval's upper end (worse than the
record beyond its noise), or its whole interval is above 1 (slower than plain DDP); the guard
then exits 1, as where a model's ranks failed (the other models still run). The record is
`benchmarks/baseline.json`, written only where every model was measured: the figures, the
commit (and whether the tree had changes), the machine, the date and the command. A record
from another machine is compared all the same, with a warning: ratios move with the cores and
memory a machine has.

Rank 0's autotune log of each model's runs 1 and 2 (screening's values, every paired test, the
check against plain DDP, unhooking) is kept in `bench-logs/` (`--log-dir`), to read where a
model kept less than it used to. It is a benchmark, not a test: it times, so CI does not run it.
docs/BENCHMARKS.md's step-gain table is the record's (tests/integration/test_bench_guard.py
checks they agree).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_gain

from autotune.comm.launch import RankFailure

ROOT = Path(__file__).resolve().parents[1]
BASELINE = Path(__file__).resolve().parent / "baseline.json"
LOGS = ROOT / "bench-logs"
MODELS = ("mlp", "transformer", "convnet")
WORLD_SIZE = 4
#: run 3's length: at least this many paired steps, and plain DDP's timed steps adding up to
#: this many seconds (short steps get more pairs).
PAIRED_STEPS, PAIRED_SECONDS = 80, 20.0


def machine() -> dict[str, Any]:
    """What the ratios depend on: the CPU, its cores, memory, and the software."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    with contextlib.suppress(ValueError, OSError):
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def commit() -> dict[str, Any]:
    """The commit the figures are of, and whether the tree differed from it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def figures(row: dict[str, Any]) -> dict[str, Any]:
    """What the record keeps of a `step_gain.cell` row."""
    a, n = row["autotune"], row["noop"]
    return {
        "plain_ms": round(row["plain_ms"], 2),
        "noop": round(n["median"], 4),
        "autotune": round(a["median"], 4),
        "low": round(a["low"], 4),
        "high": round(a["high"], 4),
        "pairs": a["n"],
        "headroom_taken": round(taken(a["median"], n["median"]), 3),
        "kept": step_gain.kept(row["restart_plan"]),
        "locked_at": row["locked_at"],
    }


def taken(ratio: float, noop: float) -> float:
    """The share of the ``noop_hook`` headroom a ratio takes: 1 at noop's step, 0 at plain's."""
    return (1.0 - ratio) / (1.0 - noop) if noop < 1.0 else math.nan


def verdict(now: dict[str, Any], recorded: dict[str, Any] | None) -> str | None:
    """Why ``now`` is flagged against ``recorded`` (None: it is not)."""
    why = []
    if recorded is not None and now["autotune"] > recorded["high"]:
        why.append(
            f"worse than recorded: {now['autotune']:.3f} above its interval's upper end "
            f"{recorded['high']:.3f}"
        )
    if now["low"] > 1.0:
        why.append(f"slower than plain DDP: the whole interval above 1 ({now['low']:.3f}-)")
    return "; ".join(why) or None


def table(now: dict[str, dict[str, Any]], record: dict[str, Any] | None) -> str:
    recorded = (record or {}).get("models", {})
    at = f" (at {record['commit']})" if record else ""
    out = [
        f"| model | plain step | noop_hook / plain | autotune / plain (95% interval) | headroom "
        f"taken | kept | recorded{at} | flag |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for model, f in now.items():
        r = recorded.get(model)
        before = "-" if r is None else f"{r['autotune']:.3f} ({r['low']:.3f}-{r['high']:.3f})"
        flag = verdict(f, r) or "ok"
        out.append(
            f"| {model} | {f['plain_ms']:.1f} ms | {f['noop']:.3f} | **{f['autotune']:.3f}** "
            f"({f['low']:.3f}-{f['high']:.3f}) | {f['headroom_taken']:.0%} | {f['kept']} "
            f"| {before} | {flag} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--record", action="store_true", help=f"write the figures to {BASELINE.name}")
    p.add_argument("--baseline", type=Path, default=BASELINE, help="the record to compare with")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--json", type=Path, default=None, help="also write step_gain's full rows here")
    p.add_argument(
        "--log-dir", type=Path, default=LOGS, help="rank 0's autotune log of runs 1 and 2, here"
    )
    args = p.parse_args(argv)
    record = json.loads(args.baseline.read_text()) if args.baseline.exists() else None
    here = machine()
    if record is None:
        print(f"no record at {args.baseline}: nothing to compare with (--record writes one)")
    elif record["machine"]["cpu"] != here["cpu"] or record["machine"]["cores"] != here["cores"]:
        print(
            f"warning: the record is from another machine ({record['machine']['cpu']}, "
            f"{record['machine']['cores']} cores; this one: {here['cpu']}, {here['cores']}): "
            "ratios move with the machine"
        )
    command = [
        f"--world-sizes={WORLD_SIZE}",
        f"--models={args.models}",
        f"--paired-steps={PAIRED_STEPS}",
        f"--paired-seconds={PAIRED_SECONDS}",
        "--breakdown",
    ]
    options = step_gain.parser().parse_args(command)
    options.log_dir = str(args.log_dir)
    rows, now, failed = [], {}, []
    began = time.perf_counter()
    for model in args.models.split(","):
        start = time.perf_counter()
        print(
            f"{model} x{WORLD_SIZE}: tuning, restarting, then paired against plain DDP ...",
            flush=True,
        )
        try:
            row = step_gain.cell(model, WORLD_SIZE, options)
        except RankFailure as exc:  # the next model still runs; nothing is recorded
            failed.append(model)
            print(f"{model} x{WORLD_SIZE}: failed: {exc}", flush=True)
            continue
        rows.append(row)
        now[model] = figures(row)
        f = now[model]
        print(
            f"{model} x{WORLD_SIZE}: autotune/plain {f['autotune']:.3f} ({f['low']:.3f}-"
            f"{f['high']:.3f}), noop/plain {f['noop']:.3f}, kept {f['kept']} "
            f"[{time.perf_counter() - start:.0f} s]",
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    print()
    print(table(now, record))
    print()
    print(step_gain.breakdown_markdown(rows))
    print(f"\n{len(rows)} models in {(time.perf_counter() - began) / 60:.1f} minutes")
    print(f"rank 0's autotune logs of runs 1 and 2: {args.log_dir}/")
    flagged = [m for m, f in now.items() if verdict(f, (record or {}).get("models", {}).get(m))]
    if failed:
        print(f"failed: {', '.join(failed)} (above)")
    if args.record and (failed or set(now) != set(MODELS)):
        print(f"not recorded: a record holds every model ({', '.join(MODELS)}), each measured")
        return 1
    if args.record:
        written = {
            **commit(),
            "date": datetime.date.today().isoformat(),
            "machine": here,
            "command": "python benchmarks/guard.py --record  (step_gain.py "
            + " ".join(command)
            + ")",
            "world_size": WORLD_SIZE,
            "models": now,
        }
        args.baseline.write_text(json.dumps(written, indent=1) + "\n")
        print(f"recorded in {args.baseline}")
        return 0
    if flagged:
        print(f"flagged: {', '.join(flagged)} (see the table)")
    return 1 if flagged or failed else 0


if __name__ == "__main__":
    sys.exit(main())
