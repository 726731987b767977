"""Train a small classifier with DDP, its gradients all-reduced by autotune's hook.

    python examples/train_ddp.py --world-size 4                        # spawns 4 CPU ranks (gloo)
    torchrun --nproc-per-node 4 examples/train_ddp.py                  # or let torchrun start them
    python examples/train_ddp.py --world-size 1 --device cuda          # CUDA/NCCL
    python examples/train_ddp.py --world-size 2 --device cuda --backend gloo   # CUDA on gloo

The task is synthetic but real learning: labels come from a fixed random "teacher" network, so
the loss falls as the student fits it. Rank 0 prints a summary at the end: steps per second, the
loss, where the tuner stands, and per message-size class the algorithm chosen, its segment, whether
it is locked (and after how many trials), its median and p99 latency and bus bandwidth.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import optuna
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import run_local
from autotune.plan import segment_text
from autotune.util.units import format_bytes, parse_bytes

INPUTS = 64
CLASSES = 10


def build_model(width: int, depth: int, seed: int = 0) -> torch.nn.Module:
    """An MLP; the same weights on every rank (DDP also broadcasts rank 0's at construction)."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(INPUTS, width), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, CLASSES))
    return torch.nn.Sequential(*layers)


class Teacher:
    """Labels inputs with a fixed random network: a target the student can actually learn."""

    def __init__(self, seed: int = 1234) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(INPUTS, 128, generator=g) / INPUTS**0.5
        self.w2 = torch.randn(128, CLASSES, generator=g) / 128**0.5

    def batch(self, g: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(size, INPUTS, generator=g)
        y = (torch.tanh(x @ self.w1) @ self.w2).argmax(dim=1)
        return x, y


@dataclass
class Result:
    """What a rank reports at the end of training."""

    steps_per_s: float
    losses: list[float]
    plan: dict[int, autotune.Choice] = field(default_factory=dict)
    stats: dict[tuple[int, str], autotune.Summary] = field(default_factory=dict)
    hook_us_median: float | None = None
    parameters: list[torch.Tensor] = field(default_factory=list)
    table: autotune.plan.Table | None = None  # what the tuner knows (rank 0), if it ran
    verdict: str | None = None  # the tuned plan's step against plain DDP's (rank 0)
    headline: str | None = None  # the plain verdict, said first (rank 0)
    unhooked_at: int | None = None  # the iteration after which autotune unhooked
    settled_at: int | None = None  # the step from which everything was locked
    settled_after_s: float | None = None  # training time (from step 0) until then
    fusion_bytes: int = 0
    metrics: str | None = None  # what rank 0's exporter served at the end, if it was on
    step_clock: str | None = None  # on CUDA: the step timed on the GPU, and how often it waited


def rank_device(rank: int, kind: str) -> torch.device:
    """Where ``rank`` trains: the CPU, or (``kind`` "cuda") GPU ``rank`` modulo the GPUs there
    are (one GPU: every rank on it), made the current one."""
    if kind != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def train(rank: int, world_size: int, args: argparse.Namespace) -> Result:
    """One rank's training loop; the process group is already initialised."""
    # Optuna reports every trial at INFO; the summary at the end says what matters here.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = rank_device(rank, args.device)
    model = build_model(args.width, args.depth).to(device)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    state = None
    if not args.no_hook:
        config = autotune.Config.from_env(
            algorithm=args.algorithm,
            fusion_bytes=args.fusion_bytes,
            **({"segment_bytes": args.segment_bytes} if args.segment_bytes else {}),
            **({"metrics_port": args.metrics_port} if args.metrics_port is not None else {}),
        )
        state = autotune.register(ddp, config)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    teacher = Teacher()
    g = torch.Generator().manual_seed(1000 + rank)  # every rank sees different data
    losses = []
    settled_at = settled_after_s = None
    began = start = time.perf_counter()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        x, y = teacher.batch(g, args.batch)
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step == 0 and rank == 0:
            # Every rank is past DDP's setup and the first all-reduce: the job is training.
            print(f"training: {args.steps} steps on {world_size} ranks", flush=True)
        if state is not None and state.tuner is not None:
            # The step from which it stayed locked (a newly seen size class re-opens tuning; a
            # re-check of the locked plan leaves it locked unless the plan lost its gain).
            if not state.locked:
                settled_at = settled_after_s = None
            elif settled_at is None:
                settled_at, settled_after_s = step, time.perf_counter() - began
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    result = Result(
        steps_per_s=args.steps / elapsed,
        losses=losses,
        settled_at=settled_at,
        settled_after_s=settled_after_s,
    )
    if state is not None:
        result.plan = state.plan()
        result.stats = state.stats()
        result.fusion_bytes = state.engine.fusion_bytes
        if state.tuner is not None and rank == 0:
            result.table = state.table()
            status = state.status()  # one snapshot: the verdict, its headline, stepping aside
            result.verdict, result.headline = status.verdict, status.headline
            result.unhooked_at = status.unhooked_at
        if state.exporter is not None and rank == 0:
            result.metrics = scrape_once(state.exporter.port, state.config.metrics_host)
        clock = state.engine.step_clock
        if clock is not None and clock.on_device:
            result.step_clock = (
                f"step clock: the GPU's (CUDA events, read {clock.lag} iterations late); "
                f"{clock.waited} readings waited for the GPU"
            )
        hook_s = sorted(state.recorder.hook_times())
        result.hook_us_median = hook_s[len(hook_s) // 2] * 1e6 if hook_s else None
        state.close()
    result.parameters = [p.detach().cpu().clone() for p in ddp.parameters()]
    return result


def scrape_once(port: int, host: str) -> str:
    """Read rank 0's endpoint as Prometheus would; say where it is and what it served."""
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    families = sum(1 for line in text.splitlines() if line.startswith("# TYPE "))
    return f"metrics: rank 0 served {samples} samples in {families} metric families at {url}"


def _digest(parameters: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in parameters:
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def summary(result: Result, world_size: int, args: argparse.Namespace) -> str:
    """A readable report of one rank's result."""
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    mode = "no hook (DDP's own all-reduce)" if args.no_hook else f"autotune, {args.algorithm}"
    lines = [] if result.headline is None else [f"verdict: {result.headline}"]
    lines.append(
        f"{world_size} ranks, {args.device}, {mode}: {result.steps_per_s:.1f} steps/s over "
        f"{args.steps} steps; loss {first:.3f} -> {last:.3f}"
    )
    if result.hook_us_median is not None:
        lines.append(
            f"hook's cost on the autograd thread: {result.hook_us_median:.0f} us a bucket "
            "(median, from the hook's call to its future's return)"
        )
    if result.table is not None:
        fusion = format_bytes(result.fusion_bytes) if result.fusion_bytes else "DDP's buckets"
        if result.table.buckets is not None:  # unhooked: DDP's own buckets, tuned
            fusion = result.table.buckets.describe()
        if result.unhooked_at is not None:
            when = f"plain DDP kept: autotune unhooked after iteration {result.unhooked_at}"
        elif result.settled_at is not None and result.settled_after_s is not None:
            when = (
                f"everything locked from step {result.settled_at} (step time until locked: "
                f"{result.settled_after_s:.1f} s)"
            )
        else:
            when = "still exploring (more steps, or run again: the next run resumes from here)"
        lines.append(f"tuner: {when}; fusion: {fusion}")
    if result.metrics is not None:
        lines.append(result.metrics)
    if result.step_clock is not None:
        lines.append(result.step_clock)
    if result.stats:
        lines.append(
            f"{'size class':>10}  {'algorithm':<10} {'segment':>9} {'state':>10} "
            f"{'messages':>8} {'median':>10} {'p99':>10} {'busbw':>10}"
        )
        entries = result.table.classes if result.table is not None else {}
        for cls, choice in result.plan.items():
            s = result.stats.get((cls, choice.algorithm))
            if s is None:
                continue
            entry = entries.get(cls)
            if entry is not None:
                status = f"{entry.state}/{entry.trials}"
            else:
                status = "default" if result.table is not None else "fixed"
            seg = segment_text(choice)
            lines.append(
                f"{format_bytes(cls):>10}  {choice.algorithm:<10} {seg:>9} {status:>10} "
                f"{s.count:>8} {s.median_s * 1e3:>8.2f}ms {s.p99_s * 1e3:>8.2f}ms "
                f"{s.busbw_gbps:>6.3f}GB/s"
            )
        lines.append(
            "  state: exploring/N or locked/N = the class's search after N trials; default = "
            "never tuned\n  (the backend's own); fixed = a plan file's. median, p99: time per "
            "message; busbw: nccl-tests'"
        )
    return "\n".join(lines)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The job's shape: the benchmarks that run this model take the same arguments."""
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--bucket-cap-mb", type=float, default=1.0, help="DDP's bucket size")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="spawn this many local ranks (default: under torchrun, its ranks; else 4)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", default=None, help="default: gloo on CPU, nccl on CUDA")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=5, help="steps before the clock starts")
    add_model_arguments(p)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument(
        "--algorithm",
        default="auto",
        help="'auto', a registered algorithm, or one on a compressed wire (native+bf16)",
    )
    p.add_argument("--segment-bytes", type=parse_bytes, default=None)
    p.add_argument(
        "--fusion-bytes", type=parse_bytes, default=None, help="default: tuned with auto, else 0"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve each rank's Prometheus metrics on this port + local rank (0: any free port)",
    )
    p.add_argument("--no-hook", action="store_true", help="plain DDP, for comparison")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device")
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and args.world_size is None:
        # Under torchrun: its environment says who we are.
        dist.init_process_group(args.backend)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        result = train(rank, world_size, args)
        digests: list[Any] = [None] * world_size
        dist.all_gather_object(digests, _digest(result.parameters))
        dist.destroy_process_group()
        same = len(set(digests)) == 1
        if rank == 0:
            print(summary(result, world_size, args))
            print(
                f"parameters bitwise identical on all {world_size} ranks: {'yes' if same else 'NO'}"
            )
            if result.verdict is not None:
                print(result.verdict)
        # Skip interpreter teardown, as autotune's own launchers do: gloo's teardown there
        # aborts now and then ("terminate called without an active exception").
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if same else 1)
    world_size = args.world_size or 4
    results: list[Any] = run_local(
        train, world_size, args, backend=args.backend, timeout_s=1800, pg_timeout_s=600
    )
    same = len({_digest(r.parameters) for r in results}) == 1
    print(summary(results[0], world_size, args))
    print(f"parameters bitwise identical on all {world_size} ranks: {'yes' if same else 'NO'}")
    if results[0].verdict is not None:
        print(results[0].verdict)  # the line the job is run for: the gain, as measured
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
