"""What autotune's NCCL profiler plugin costs NCCL's threads, per collective (no GPU needed).

    python benchmarks/profiler_cost.py [--collectives 200000]

Builds benchmarks/profiler_cost.c, which compiles the plugin's own C source in and plays NCCL
2.28's events for an all-reduce on two channels (8 calls into the plugin) on 1, 2 and 4 threads
while another drains the ring, and prints a markdown table: ns per collective on each producing
thread, the records' own cost (what `autotune_nccl_profiler_cost_seconds` reports), and what the
ring dropped; once as the plugin runs by default, once with a chained profiler that does nothing
(benchmarks/profiler_noop.c: what forwarding costs), once sampling every 10th collective. Needs
a C compiler (``cc``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parent / "plugins" / "autotune-nccl" / "autotune_nccl"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collectives", type=int, default=200_000, help="per thread")
    args = p.parse_args(argv)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("no C compiler (cc, gcc) on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        exe, noop = Path(tmp) / "profiler_cost", Path(tmp) / "noop.so"
        subprocess.run(
            [cc, "-O2", "-pthread", "-o", str(exe), str(HERE / "profiler_cost.c"),
             str(PLUGIN / "_profiler_chain.c"), "-ldl"],
            check=True,
        )  # fmt: skip
        subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-o", str(noop), str(HERE / "profiler_noop.c")],
            check=True,
        )
        settings = [
            ("as it is", {}),
            ("chained (a no-op profiler)", {"AUTOTUNE_NCCL_PROFILER_CHAIN": str(noop)}),
            ("sampling every 10th", {"AUTOTUNE_NCCL_PROFILER_SAMPLE": "10"}),
        ]
        print(
            "| plugin | producing threads | ns per collective (8 plugin calls) "
            "| records' own cost, ns | records | ring full |"
        )
        print("|---|---|---|---|---|---|")
        for name, extra in settings:
            env = {**os.environ, **extra}  # the node file on, as by default
            out = subprocess.run(
                [str(exe), str(args.collectives)], check=True, capture_output=True, text=True,
                env=env,
            ).stdout  # fmt: skip
            for line in out.splitlines():
                f = line.split()
                row = dict(zip(f[::2], f[1::2], strict=True))
                print(
                    f"| {name} | {row['threads']} | "
                    f"{float(row['ns_per_collective_per_thread']):.0f} | "
                    f"{float(row['cost_ns_per_record']):.0f} | {row['records']} | "
                    f"{row['ring_full']} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
