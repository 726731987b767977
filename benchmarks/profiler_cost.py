"""What autotune's NCCL profiler plugin costs NCCL's threads, per collective (no GPU needed).

    python benchmarks/profiler_cost.py [--collectives 200000]

Builds benchmarks/profiler_cost.c, which compiles the plugin's own C source in and plays NCCL
2.28's events for an all-reduce on two channels (5 calls into the plugin) on 1, 2 and 4 threads
while a fifth drains the ring, and prints a markdown table: ns per collective on each producing
thread, and what the ring dropped. Needs a C compiler (``cc``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collectives", type=int, default=200_000, help="per thread")
    args = p.parse_args(argv)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("no C compiler (cc, gcc) on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "profiler_cost"
        subprocess.run(
            [cc, "-O2", "-pthread", "-o", str(exe), str(HERE / "profiler_cost.c")], check=True
        )
        out = subprocess.run(
            [str(exe), str(args.collectives)], check=True, capture_output=True, text=True
        ).stdout
    print("| producing threads | ns per collective (5 plugin calls) | records | ring full |")
    print("|---|---|---|---|")
    for line in out.splitlines():
        f = line.split()
        row = dict(zip(f[::2], f[1::2], strict=True))
        print(
            f"| {row['threads']} | {float(row['ns_per_collective_per_thread']):.0f} | "
            f"{row['records']} | {row['ring_full']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
