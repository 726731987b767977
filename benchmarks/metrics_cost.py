"""What the Prometheus exporter costs: recording each message, and serving a scrape.

    python benchmarks/metrics_cost.py --world-size 4 --steps 100

Trains examples/train_ddp.py's model with the tuner and the exporter on, on a free port.
- Recording: every message's recording (the record kept, the tuner's window, the metrics) is
  timed on the engine's thread, where it runs, per message and against the median step time.
- Scraping: after training, rank 0 serves 50 scrapes over HTTP and builds the exposition 50 times
  in-process; the median of each is reported, with the exposition's size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
from prometheus_client import generate_latest
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import run_local
from autotune.ddp.events import Event
from autotune.ddp.stats import MessageRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_ddp import Teacher, add_model_arguments, build_model


def _rank(rank: int, world_size: int, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    ddp = DDP(build_model(args.width, args.depth), bucket_cap_mb=args.bucket_cap_mb)
    state = autotune.register(ddp, autotune.Config(metrics_port=0, storage=storage))
    exporter = state.exporter
    assert exporter is not None
    recording: list[float] = []
    emit = state.engine._emit

    def timed(event: Event) -> None:
        start = time.perf_counter()
        emit(event)
        if isinstance(event, MessageRecord):
            recording.append(time.perf_counter() - start)

    # The whole of recording a message: the record kept, the tuner's window, the metrics.
    state.engine._emit = timed  # type: ignore[method-assign]
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    teacher = Teacher()
    g = torch.Generator().manual_seed(rank)
    steps = []
    for _ in range(args.steps):
        x, y = teacher.batch(g, args.batch)
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps.append(time.perf_counter() - start)
    out: dict[str, Any] = {"steps": steps, "recording": recording}
    if rank == 0:
        url = f"http://127.0.0.1:{exporter.port}/metrics"
        http, build = [], []
        body = b""
        for _ in range(50):
            start = time.perf_counter()
            with urllib.request.urlopen(url) as response:
                body = response.read()
            http.append(time.perf_counter() - start)
            start = time.perf_counter()
            generate_latest(exporter.registry)
            build.append(time.perf_counter() - start)
        series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
        out.update(http=http, build=build, size=len(body), series=series)
    state.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    add_model_arguments(p)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{Path(tmp) / 'tuning.db'}"
        results = run_local(_rank, args.world_size, args, storage, timeout_s=3600)
    step = statistics.median(s for r in results for s in r["steps"])
    recording = [t for r in results for t in r["recording"]]
    per_step = len(recording) / (args.world_size * args.steps)
    med = statistics.median(recording)
    print(f"{args.world_size} ranks, {args.steps} steps; step median {step * 1e3:.1f} ms")
    print(
        f"recording: median {med * 1e6:.1f} us per message (mean "
        f"{statistics.fmean(recording) * 1e6:.1f} us), {per_step:.1f} messages per step: "
        f"{per_step * med / step:.3%} of step time"
    )
    r0 = results[0]
    print(
        f"scrape (rank 0, {r0['series']} samples, {r0['size'] / 1024:.1f} KiB): HTTP median "
        f"{statistics.median(r0['http']) * 1e3:.2f} ms, building the exposition median "
        f"{statistics.median(r0['build']) * 1e3:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
