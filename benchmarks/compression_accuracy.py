"""What compression on the wire does to training: the example trained from the same seed without
it and on each wire dtype, the loss curves side by side.

    python benchmarks/compression_accuracy.py --steps 600 --plot docs/img/compression-loss.png

Each arm is `examples/train_ddp.py`'s job, the same model, batches and seed: plain DDP, and DDP
with autotune fixed on the backend's own all-reduce on a compressed wire (``native+bf16``,
``native+fp16``: what PyTorch's ``bf16_compress_hook`` and ``fp16_compress_hook`` do), so the only
difference is the cast. Prints, per arm, the final loss (the mean of the last 50 steps, rank 0),
its difference from plain DDP's, and the compressed messages' cast error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import train_ddp

from autotune.comm.launch import run_local

ARMS = {"plain DDP": ["--no-hook"], "native+bf16": ["--algorithm", "native+bf16"],
        "native+fp16": ["--algorithm", "native+fp16"]}  # fmt: skip
TAIL = 50


def run(world_size: int, steps: int, extra: list[str]) -> dict[str, Any]:
    args = train_ddp.parse_args(["--steps", str(steps), "--warmup", "0", *extra])
    rank0 = run_local(train_ddp.train, world_size, args, timeout_s=3600)[0]
    errors = [s.cast_error for s in rank0.stats.values() if s.cast_error is not None]
    return {"losses": rank0.losses, "cast_error": statistics.median(errors) if errors else None}


def _smoothed(values: list[float], width: int) -> list[float]:
    """The trailing mean of ``values`` over ``width`` steps (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - width] if i >= width else 0.0)
        out.append(total / min(i + 1, width))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--plot", default=None, help="write the loss curves here (PNG; matplotlib)")
    args = p.parse_args(argv)
    curves = {}
    for name, extra in ARMS.items():
        print(f"{name}: {args.steps} steps at {args.world_size} ranks ...", flush=True)
        curves[name] = run(args.world_size, args.steps, extra)
    plain = statistics.fmean(curves["plain DDP"]["losses"][-TAIL:])
    print(
        f"\n| arm | final loss (mean of the last {TAIL} steps) | - plain DDP's "
        "| cast error (median) |"
    )
    print("|---|---:|---:|---:|")
    for name, c in curves.items():
        final = statistics.fmean(c["losses"][-TAIL:])
        error = "-" if c["cast_error"] is None else f"{c['cast_error']:.2e}"
        print(f"| {name} | {final:.4f} | {final - plain:+.4f} | {error} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax, diff) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=[3, 2])
        base = curves["plain DDP"]["losses"]
        for name, c in curves.items():
            (line,) = ax.plot(c["losses"], label=name, linewidth=0.8)
            if name != "plain DDP":
                gap = [a - b for a, b in zip(c["losses"], base, strict=True)]
                diff.plot(_smoothed(gap, TAIL // 2), label=name, color=line.get_color())
        ax.set_ylabel("training loss (rank 0)")
        ax.set_yscale("log")
        ax.set_title(
            f"The example at {args.world_size} ranks, one seed: with and without compression"
        )
        ax.legend()
        diff.axhline(0.0, color="grey", linewidth=0.6)
        diff.set_xlabel("step")
        diff.set_ylabel(f"loss - plain DDP's\n(mean of {TAIL // 2} steps)")
        diff.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"\nwrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
