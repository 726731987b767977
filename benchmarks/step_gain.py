"""What tuning pays: the training step with autotune's locked plan against plain DDP, per model.

    python benchmarks/step_gain.py --world-sizes 2,4 --models mlp,transformer,convnet

Three models with different gradient shapes: the example's MLP (one ~3 MiB bucket after DDP's
rebuild at 1 MiB buckets), a 4-layer transformer encoder (d=256, ~12 MiB of gradients in DDP's
default 25 MiB buckets) and a small convolutional net (~1.5 MiB, many small tensors); and two
shapes held out from tuning any change (``--models lstm,thin``: a recurrent language model and a
many-thin-layer MLP), to check a change keeps what they gain. For each
model and world size, three runs on spawned CPU ranks (gloo, 127.0.0.1), one intra-op thread per
rank as torchrun sets (``--threads`` to change it):

1. tune: autotune alone from an empty storage (the live tuner, every phase, and where it steps
   aside, DDP's bucket size: `autotune.tuning.buckets`); records the step from which everything was
   decided, and every step's time; it ends 20 steps after that where it unhooked (nothing
   changes from there), else at ``--tune-steps``;
2. restart: autotune alone again on run 1's storage: the stored plan is confirmed against the
   baseline (or dropped) before it is locked, where run 1 kept the baseline with a lead, the
   lead gets its retry, and a stored bucket size its paired test; records the same;
3. paired: plain DDP, DDP with PyTorch's ``noop_hook`` (no communication: the headroom) and DDP
   with autotune as the job after the restart runs it: where the restart kept a plan, or
   unhooked onto a bucket size, that table as a plan file (a plan runs fixed; a bucket
   size is unhooked onto after the first iteration); else autotune on (a copy of) its
   storage, which locks the stored baseline at once and unhooks. They take turns step by
   step on the same batches, in a rotating order, every rank aligned before each step; once
   autotune has settled, each one's step time over plain DDP's (slowest rank), for
   ``--paired-steps`` steps or until plain DDP's timed steps add up to ``--paired-seconds``,
   whichever is later.

``--hook-only`` runs run 3 alone, with the autotune arm fixed on native (the baseline's lane,
DDP's buckets): what the hook itself costs each model's step, which a plan must win back in the
paired tests before it beats a job that unhooked. ``--plan-file FILE`` runs run 3 alone with the
autotune arm on that plan (a stored table's JSON, as `autotune.Config.plan_file` reads it): what
one plan makes of the step, to compare two versions of an algorithm on the same plan.

``--device cuda`` trains on CUDA tensors (rank r on GPU r modulo the GPUs there are; with one GPU
every rank shares it), on gloo (which stages them through host memory itself; autotune's
Python-driven algorithms stage through pinned host memory) or, with ``--backend nccl``, on NCCL
(several ranks on one GPU need NCCL 2.30 or newer and ``NCCL_MULTI_RANK_GPU_ENABLE=1`` in the
environment). A step is then timed until the GPU has finished it. ``--models gpt2,resnet50``
are sized for a GPU (benchmarks/gpu_models.py: GPT-2 small in bf16, ResNet-50). Written for
issue 10's GPU cell; on the one lease so far (an H200) it hung at the first step, in the hook
(fixed since: docs/BENCHMARKS.md, "On a GPU").

Exploring cost: run 1's total step time until it locked, minus run 3's median plain step times as
many steps (the restart's cost likewise). Ratios below 1 are faster than plain DDP; intervals
are the sign test's 95% interval for the median (autotune.tuning.paired_test.median_interval).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import RankFailure, run_local
from autotune.plan import Arm, Table
from autotune.testing.settled import all_settled, control_device, everywhere
from autotune.tuning.paired_test import median_interval
from autotune.util.cores import usable_cores

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_models import gpt2, resnet50
from train_ddp import build_model, rank_device

MODELS = ("mlp", "transformer", "convnet")
#: Shapes no change was tuned against, to check a change keeps what they gain: a recurrent
#: language model (embedding, 2-layer LSTM, decoder; ~12 MB of gradients) and a many-thin-layer
#: MLP (48 layers of width 128; ~3 MB in many small tensors).
HELD_OUT = ("lstm", "thin")
#: Sized for a GPU (benchmarks/gpu_models.py): GPT-2 small in bf16 (4 sequences of 512 tokens a
#: rank), ResNet-50 in fp32 (32 images of 224 x 224 a rank).
GPU_MODELS = ("gpt2", "resnet50")
#: Runs 1 and 2 end this many steps after autotune unhooked and decided DDP's bucket size
#: (or at ``--tune-steps``): nothing changes after that.
AFTER_DECIDED = 20


def model_and_batch(
    name: str, seed: int = 0, device: torch.device | None = None
) -> tuple[torch.nn.Module, Any]:
    """The model (same weights on every rank), and a function giving (inputs, labels); on
    ``device`` where one is given (the batches drawn on the CPU, then moved there)."""
    model, batch = _model_and_batch(name, seed)
    if device is None or device.type == "cpu":
        return model, batch

    def moved(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch(g)
        return x.to(device), y.to(device)

    return model.to(device), moved


class _LanguageModel(torch.nn.Module):
    """Embedding, a 2-layer LSTM and a decoder: each position's next-token logits, flat."""

    def __init__(self, vocabulary: int, width: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocabulary, width)
        self.lstm = torch.nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.decode = torch.nn.Linear(width, vocabulary)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        logits: torch.Tensor = self.decode(hidden)
        return logits.flatten(0, 1)


def _model_and_batch(name: str, seed: int) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(seed)
    if name == "mlp":
        model: torch.nn.Module = build_model(512, 4)

        def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)

        return model, batch
    if name == "transformer":
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        encoder = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        model = torch.nn.Sequential(encoder, torch.nn.Flatten(), torch.nn.Linear(256 * 32, 10))

        def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(8, 32, 256, generator=g), torch.randint(0, 10, (8,), generator=g)

        return model, batch
    if name == "convnet":
        c = torch.nn.Conv2d
        model = torch.nn.Sequential(
            c(3, 32, 3, padding=1), torch.nn.ReLU(), c(32, 64, 3, padding=1), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), c(64, 128, 3, padding=1), torch.nn.ReLU(),
            c(128, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            c(128, 256, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(256, 10),
        )  # fmt: skip

        def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)

        return model, batch
    if name == "lstm":
        model = _LanguageModel(vocabulary=4000, width=256)

        def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = torch.randint(0, 4000, (8, 33), generator=g)
            return tokens[:, :-1], tokens[:, 1:].flatten()  # each position's next token

        return model, batch
    if name == "thin":
        model = build_model(128, 48)

        def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)

        return model, batch
    if name == "gpt2":
        model = gpt2()
        vocabulary = model.wte.num_embeddings

        def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = torch.randint(0, vocabulary, (4, 513), generator=g)
            return tokens[:, :-1], tokens[:, 1:].flatten()  # each position's next token

        return model, batch
    if name == "resnet50":
        model = resnet50()
        # Four batches drawn once, taken in a random order: drawing 32 images a step would
        # cost the host more than the GPU's step (the contents do not change the step's time).
        pool = [
            torch.randn(32, 3, 224, 224, generator=torch.Generator().manual_seed(i))
            for i in range(4)
        ]

        def batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            i = int(torch.randint(0, len(pool), (1,), generator=g))
            return pool[i], torch.randint(0, 1000, (32,), generator=g)

        return model, batch
    known = ", ".join(MODELS + HELD_OUT + GPU_MODELS)
    raise ValueError(f"unknown model {name!r}; choose from {known}")


def _step(ddp: torch.nn.Module, opt: torch.optim.Optimizer, x: Any, y: Any) -> float:
    """One training step's wall time; on CUDA tensors, until the GPU has finished it."""
    cuda = isinstance(x, torch.Tensor) and x.is_cuda
    if cuda:
        torch.cuda.synchronize()
    begin = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - begin


def _slowest(times: list[float]) -> list[float]:
    """Per step, the slowest rank's time (every rank calls this at the same point)."""
    t = torch.tensor(times, dtype=torch.float64, device=control_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def alone(
    rank: int, world_size: int, args: argparse.Namespace, storage: str, run: str = "tune"
) -> dict[str, Any]:
    """Runs 1 and 2 (``run``: "tune", "restart"): autotune by itself; its steps, the step it
    locked at, its verdict, plan. With ``args.log_dir``, rank 0's autotune log (INFO: screening,
    each paired test, the check, unhooking) goes to a file there, named for the model, the
    world size and the run."""
    torch.set_num_threads(args.threads)
    if rank == 0 and args.log_dir:
        _log_to(Path(args.log_dir) / f"{args.model}-x{world_size}-{run}.log")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    model, batch = model_and_batch(args.model, device=rank_device(rank, args.device))
    ddp = DDP(model, **args.ddp)
    config = autotune.Config(storage=storage, timeout_s=120, compression=args.compression)
    state = autotune.register(ddp, config)
    assert state.tuner is not None
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    times, locked_at = [], None
    for step in range(args.tune_steps):
        x, y = batch(g)
        times.append(_step(ddp, opt, x, y))
        # Locked from the first locked step on (a re-check of the locked plan leaves it locked
        # unless it falls back; where it unhooks, once DDP's bucket size is decided): the
        # same step on every rank (`AutotuneState.locked`); rank 0's is reported.
        locked_at = (locked_at if locked_at is not None else step) if state.locked else None
        # Unhooked and decided: nothing is measured or changed from here (no re-checks).
        unhooking = state.unhooking
        final = unhooking is not None and unhooking.at is not None and state.settled
        if everywhere(final and step >= (locked_at or 0) + AFTER_DECIDED):
            break
    times = _slowest(times)
    unhooking = state.unhooking
    tuner = None if unhooking is None else unhooking.buckets
    search = None if tuner is None else tuner.search
    out: dict[str, Any] = {
        "steps": times,
        "locked_at": locked_at,
        "aside_at": None if unhooking is None else unhooking.at,
        "bucket_iterations": None if tuner is None else tuner.iterations,
        "bucket_duels": None
        if search is None
        else [
            (cap, o.challenger_won, o.gain.ratio, o.gain.pairs, o.why) for cap, o in search.history
        ],
    }
    if rank == 0:
        out["table"] = state.table().to_json()
        out["verdict"] = state.verdict()
        out["duels"] = [
            (kind, arm.describe(), o.challenger_won, o.gain.ratio, o.gain.pairs)
            for kind, arm, o in (
                state.tuner.decider.plan_search.history if state.tuner.decider else []
            )
        ]
    state.close()
    return out


def paired(
    rank: int, world_size: int, args: argparse.Namespace, storage: str, plan_file: str | None
) -> dict[str, Any]:
    """Run 3: plain, noop_hook and autotune as a job after run 2 runs it, step by step, in a
    rotating order: with the baseline kept, autotune restarted on run 2's storage (it locks the
    stored baseline and unhooks); with a plan kept, that plan fixed (``plan_file``). Every arm
    trains until autotune has settled, then the steps are timed. (A paired test inside this rotation
    would time the other arms' steps too: the engine's step runs from one of its iterations'
    ends to the next. So the restart's confirmation is run 2's, alone.)"""
    torch.set_num_threads(args.threads)
    model, batch = model_and_batch(args.model, device=rank_device(rank, args.device))
    import copy

    plain = DDP(copy.deepcopy(model), **args.ddp)
    noop = DDP(copy.deepcopy(model), **args.ddp)
    noop.register_comm_hook(None, noop_hook)
    tuned = DDP(copy.deepcopy(model), **args.ddp)
    if args.hook_only:  # the baseline's lane, fixed: the hook's own cost
        config = autotune.Config(algorithm="native", fusion_bytes=0, timeout_s=120)
    elif plan_file is None:
        config = autotune.Config(storage=storage, timeout_s=120, compression=args.compression)
    else:
        config = autotune.Config(plan_file=plan_file, timeout_s=120)
    state = autotune.register(tuned, config)
    arms = {"plain": plain, "noop": noop, "autotune": tuned}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in arms.items()}
    times: dict[str, list[float]] = {k: [] for k in arms}
    # Each timed step's CPU seconds in this rank's process, every thread (gloo's, the engine's),
    # and, on rank 0 (it is the host's: one rank reads it), the cores' idle seconds over it.
    cpu: dict[str, list[float]] = {k: [] for k in arms}
    idle: dict[str, list[float]] = {k: [] for k in arms}
    g = torch.Generator().manual_seed(rank)
    order = list(arms)
    settled_at = None
    step = 0
    # The autotune arm's timed steps: (its iteration, when it began, when it ended).
    windows: list[tuple[int, float, float]] = []
    while _more(times["plain"], args):
        x, y = batch(g)
        for name in order[step % 3 :] + order[: step % 3]:
            # Every arm's step starts with the ranks aligned, as a DDP step does after the last
            # one's all-reduces. A noop_hook step aligns nothing, and without this the arm after
            # it inherited the ranks' skew: a second plain DDP in the third place measured
            # 1.028x the first at 4 ranks (mlp, 120 steps), 0.996x with it.
            dist.barrier()
            unused = idle_seconds() if rank == 0 else None
            begin, used = time.perf_counter(), time.process_time()
            t = _step(arms[name], opts[name], x, y)
            # Timed from 5 steps after every rank settled (buffers, DDP's bucket rebuild, and
            # the reducer rebuilt where autotune unhooked, are behind).
            if settled_at is not None and step >= settled_at + 5:
                times[name].append(t)
                cpu[name].append(time.process_time() - used)
                now = None if unused is None else idle_seconds()
                if unused is not None and now is not None:
                    idle[name].append(now - unused)
                if name == "autotune":  # its engine's iteration: one a step of this arm
                    windows.append((step + 1, begin, time.perf_counter()))
        done = state.tuner is None or all_settled(state)
        if settled_at is None and (done or step >= args.tune_steps):
            settled_at = step
        step += 1
    out: dict[str, Any] = {k: _slowest(v) for k, v in times.items()}
    out["parts"] = _parts(state, windows, times["autotune"]) if args.breakdown else None
    out["cpu"] = {k: statistics.median(v) for k, v in cpu.items() if v}
    # A mean: the OS counts idle time in ticks (10 ms), which a step's reading rounds.
    out["idle"] = {k: statistics.mean(v) for k, v in idle.items() if v}
    out["settled_at"] = settled_at
    out["aside_at"] = None if state.unhooking is None else state.unhooking.at
    if rank == 0:
        out["verdict"] = state.verdict()
    state.close()
    return out


def _parts(
    state: autotune.AutotuneState, windows: list[tuple[int, float, float]], steps: list[float]
) -> list[dict[str, Any]] | None:
    """This rank's autotune steps taken apart (``--breakdown``), from what its engine recorded:
    per timed step, its time, the communication left after backward handed over its last
    bucket (exposed), the hook's calls on the autograd thread, and each message: its size
    class, algorithm, time and time blocked on peers. None where the step ran without the hook
    (autotune unhooked: DDP's own all-reduce, nothing to take apart)."""
    state.engine.settle(30.0)
    exposed = {r.iteration: r.exposed_s for r in state.recorder.iterations()}
    if not any(i in exposed for i, _, _ in windows):
        return None
    calls = state.recorder.hook_calls()
    records = state.recorder.records()
    out = []
    for (iteration, begin, end), step in zip(windows, steps, strict=True):
        out.append(
            {
                "step": step,
                "exposed": exposed.get(iteration, 0.0),
                "hook": sum(s for at, s in calls if begin <= at <= end),
                "messages": [
                    (r.size_class, r.algorithm, r.seconds, r.wait_s)
                    for r in records
                    if begin <= r.started <= end
                ],
            }
        )
    return out


def breakdown(per_rank: list[list[dict[str, Any]] | None], noop: list[float]) -> dict[str, Any]:
    """Where the autotune arm's step goes beyond ``noop`` (the slowest rank's noop_hook steps),
    per step on its slowest rank, as medians over the steps (ms): ``backward`` is the step
    less the communication exposed after backward, over noop's step (the hook's calls, the
    CPU that messages take beside backward); ``exposed`` the rest. Per (class, algorithm):
    a message's median time and the part of it blocked on peers."""
    if any(p is None for p in per_rank):
        return {"hooked": False}
    ranks = [p for p in per_rank if p is not None]
    slowest = [max(steps, key=lambda s: s["step"]) for steps in zip(*ranks, strict=True)]
    ms = 1e3
    over = [(s["step"] - s["exposed"] - n) * ms for s, n in zip(slowest, noop, strict=True)]
    messages: dict[tuple[int, str], list[tuple[float, float | None]]] = {}
    for s in slowest:
        for cls, algorithm, seconds, waited in s["messages"]:
            messages.setdefault((cls, algorithm), []).append((seconds, waited))
    median = statistics.median
    return {
        "hooked": True,
        "step_ms": median(s["step"] * ms for s in slowest),
        "backward_over_noop_ms": median(over),
        "exposed_ms": median(s["exposed"] * ms for s in slowest),
        "hook_ms": median(s["hook"] * ms for s in slowest),
        "messages": [
            {
                "class": cls,
                "algorithm": algorithm,
                "per_step": len(times) / len(slowest),
                "ms": median(t for t, _ in times) * ms,
                "waiting_ms": None
                if any(w is None for _, w in times)
                else median(w for _, w in times if w is not None) * ms,
            }
            for (cls, algorithm), times in sorted(messages.items())
        ],
    }


def _more(plain: list[float], args: argparse.Namespace) -> bool:
    """Whether run 3 goes on: fewer than ``--paired-steps`` timed, or (with
    ``--paired-seconds``) less plain DDP step time than that on some rank. Every rank calls it
    at the same point, untimed; with ``--paired-seconds`` the ranks agree on it (MAX)."""
    more = len(plain) < int(args.paired_steps)
    if args.paired_seconds <= 0:
        return more
    flag = torch.tensor([int(more or sum(plain) < args.paired_seconds)], device=control_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) > 0


def _ratio(a: list[float], b: list[float]) -> dict[str, float]:
    r = [x / y for x, y in zip(a, b, strict=True)]
    low, high = median_interval(r)
    return {"median": statistics.median(r), "low": low, "high": high, "n": len(r)}


def _log_to(path: Path) -> None:
    """Send this process's autotune log, from INFO up, to ``path`` (made anew)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log = logging.getLogger("autotune")
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def _for_model(args: argparse.Namespace, model: str) -> None:
    """Point the ranks' arguments at ``model``: the mlp runs in 1 MiB buckets, as the example."""
    args.model = model
    args.ddp = {"bucket_cap_mb": 1.0} if model == "mlp" else {}


def _arm(table: Table) -> Arm:
    """The whole plan a stored table keeps (`Arm()`: the baseline)."""
    return Arm.of({cls: e.choice for cls, e in table.classes.items()}, table.fusion_bytes or 0)


def _launch(args: argparse.Namespace) -> dict[str, Any]:
    """`run_local`'s options for every run: the backend, and its limit (`--run-timeout`)."""
    return {"backend": args.backend, "timeout_s": args.run_timeout}


def fixed_cost(model: str, world_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """``--hook-only`` or ``--plan-file``: run 3 alone, the autotune arm fixed on the
    baseline's lane or on the plan."""
    _for_model(args, model)
    ranks = run_local(paired, world_size, args, "", args.plan_file, **_launch(args))
    pair = ranks[0]
    return {
        "model": model,
        "world_size": world_size,
        "plain_ms": statistics.median(pair["plain"]) * 1e3,
        "noop": _ratio(pair["noop"], pair["plain"]),
        "hook": _ratio(pair["autotune"], pair["plain"]),
        "breakdown": _breakdown(ranks, args),
    }


def _breakdown(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any] | None:
    """Run 3's breakdown (``--breakdown``; else None), with plain DDP's and noop_hook's steps
    beside it."""
    if not args.breakdown:
        return None
    out = breakdown([r["parts"] for r in ranks], ranks[0]["noop"])
    out["plain_ms"] = statistics.median(ranks[0]["plain"]) * 1e3
    out["noop_ms"] = statistics.median(ranks[0]["noop"]) * 1e3
    out["cpu_ms"] = {
        arm: statistics.mean(r["cpu"][arm] for r in ranks) * 1e3 for arm in ranks[0]["cpu"]
    }
    out["cores"] = usable_cores()
    out["idle_ms"] = {arm: seconds * 1e3 for arm, seconds in ranks[0]["idle"].items()}
    return out


def idle_seconds() -> float | None:
    """Seconds the host's cores have spent idle since boot, all cores together (Linux's
    /proc/stat, in ticks of 1/CLK_TCK s: meaningful as a mean over many steps); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")  # idle, iowait
    except (OSError, ValueError, IndexError):
        return None


def beyond_noop_on_cores(cpu_ms: dict[str, float], ranks: int, cores: int) -> float:
    """The least wall time (ms) the CPU a rank's autotune step spends beyond noop_hook's takes
    when ``ranks`` ranks share ``cores`` cores, each kept busy: that extra work, over the ranks'
    cores. The rest of the step's gap over noop_hook is waiting: ranks that have finished their
    part blocked on one that has not, a core idle meanwhile."""
    return (cpu_ms["autotune"] - cpu_ms["noop"]) * ranks / min(ranks, cores)


def cell(model: str, world_size: int, args: argparse.Namespace) -> dict[str, Any]:
    _for_model(args, model)
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{Path(tmp) / 'tuning.db'}"
        tune = run_local(alone, world_size, args, storage, "tune", **_launch(args))
        restart = run_local(alone, world_size, args, storage, "restart", **_launch(args))[0]
        # Run 3 on a copy of what run 2 left, or on run 2's plan, fixed.
        plan_file = None
        table = Table.from_json(restart["table"])
        if _arm(table) != Arm() or table.buckets is not None:
            plan_file = str(Path(tmp) / "plan.json")
            Path(plan_file).write_text(json.dumps(restart["table"]))
        shutil.copy(Path(tmp) / "tuning.db", Path(tmp) / "paired.db")
        copied = f"sqlite:///{Path(tmp) / 'paired.db'}"
        ranks = run_local(paired, world_size, args, copied, plan_file, **_launch(args))
    pair = ranks[0]
    plain_median = statistics.median(pair["plain"])
    first = tune[0]

    def cost(run: dict[str, Any]) -> float:
        """A run's step time until it locked, over as many of run 3's median plain steps."""
        locked = run["locked_at"]
        explored = run["steps"][: locked if locked is not None else len(run["steps"])]
        return float(sum(explored) - plain_median * len(explored))

    return {
        "model": model,
        "world_size": world_size,
        "plain_ms": plain_median * 1e3,
        "noop": _ratio(pair["noop"], pair["plain"]),
        "autotune": _ratio(pair["autotune"], pair["plain"]),
        "paired_settled_at": pair["settled_at"],
        "paired_aside_at": pair["aside_at"],
        "paired_verdict": pair["verdict"],
        "breakdown": _breakdown(ranks, args),
        "locked_at": first["locked_at"],
        "exploring_cost_s": cost(first),
        "restart_cost_s": cost(restart),
        "plan": first["table"],
        "verdict": first["verdict"],
        "duels": first["duels"],
        "aside_at": first["aside_at"],
        "bucket_duels": first["bucket_duels"],
        "bucket_iterations": first["bucket_iterations"],
        "restart_bucket_duels": restart["bucket_duels"],
        "restart_locked_at": restart["locked_at"],
        "restart_plan": restart["table"],
        "restart_verdict": restart["verdict"],
        "restart_duels": restart["duels"],
    }


def kept(table_json: dict[str, Any]) -> str:
    """What a run's stored table keeps: its plan, or the baseline (and its lead, if any), and
    DDP's bucket size where it unhooked."""
    table = Table.from_json(table_json)
    arm = _arm(table)
    plan = arm.describe() if arm != Arm() else "the baseline"
    if table.lead is not None:
        plan += f"; lead: {table.lead.describe()}"
    if table.buckets is not None:
        plan += f"; aside: {table.buckets.describe()}"
    return plan


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| model | ranks | plain step | noop_hook / plain | autotune / plain (95% interval) "
        "| locked at step | exploring cost | run 1 kept | restart: locked at (its cost) "
        "| restart kept "
        "| paired run: unhooked after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, n = r["autotune"], r["noop"]
        out.append(
            f"| {r['model']} | {r['world_size']} | {r['plain_ms']:.1f} ms | {n['median']:.3f} "
            f"| {a['median']:.3f} ({a['low']:.3f}-{a['high']:.3f}) | {r['locked_at']} "
            f"| {r['exploring_cost_s']:+.2f} s | {kept(r['plan'])} | {r['restart_locked_at']} "
            f"({r['restart_cost_s']:+.2f} s) | {kept(r['restart_plan'])} "
            f"| {r['paired_aside_at'] if r['paired_aside_at'] is not None else 'no'} |"
        )
    return "\n".join(out)


def breakdown_markdown(rows: list[dict[str, Any]]) -> str:
    """``--breakdown``'s table: where each model's autotune step goes, against plain DDP's and
    noop_hook's (medians, ms; the slowest rank's per step)."""
    out = [
        "| model | ranks | plain | noop_hook | autotune | headroom taken | backward over noop "
        "(hook's calls) | exposed after backward | messages a step: time (blocked on peers) "
        "| CPU a rank: plain / noop / autotune | autotune's CPU beyond noop, on the cores "
        "| cores idle: plain / noop / autotune |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        b = r.get("breakdown")
        if b is None:
            continue
        if not b["hooked"]:
            out.append(
                f"| {r['model']} | {r['world_size']} | {r['plain_ms']:.1f} | - | - | - | - | - "
                "| unhooked: DDP's own all-reduce, nothing to take apart | - | - | - |"
            )
            continue
        plain, noop, step = b["plain_ms"], b["noop_ms"], b["step_ms"]
        taken = (plain - step) / (plain - noop) if plain > noop else float("nan")
        messages = "; ".join(
            f"{m['per_step']:.0f} x {_size(m['class'])} `{m['algorithm']}` {m['ms']:.1f}"
            + ("" if m["waiting_ms"] is None else f" ({m['waiting_ms']:.1f})")
            for m in b["messages"]
        )
        arms = ("plain", "noop", "autotune")
        cpu, beyond, idle = "-", "-", "-"
        if "cpu_ms" in b:  # rows recorded before the CPU was counted have none
            cpu = " / ".join(f"{b['cpu_ms'][arm]:.1f}" for arm in arms)
            on_cores = beyond_noop_on_cores(b["cpu_ms"], r["world_size"], b["cores"])
            beyond = f"{on_cores:.1f} ({b['cores']} cores)"
        if b.get("idle_ms"):
            idle = " / ".join(f"{b['idle_ms'][arm]:.1f}" for arm in arms)
        out.append(
            f"| {r['model']} | {r['world_size']} | {plain:.1f} | {noop:.1f} | {step:.1f} "
            f"| {taken:.0%} | {b['backward_over_noop_ms']:.1f} ({b['hook_ms']:.1f}) "
            f"| {b['exposed_ms']:.1f} | {messages or '-'} | {cpu} | {beyond} | {idle} |"
        )
    return "\n".join(out)


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def parser() -> argparse.ArgumentParser:
    """The command line (`benchmarks/guard.py` builds its runs from it too)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-sizes", default="2,4")
    p.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"of {', '.join(MODELS + HELD_OUT + GPU_MODELS)}: {', '.join(HELD_OUT)} are held "
        f"out (no change tuned against them), {', '.join(GPU_MODELS)} sized for a GPU",
    )
    p.add_argument(
        "--tune-steps", type=int, default=1000, help="run 1 and run 2, at most (see AFTER_DECIDED)"
    )
    p.add_argument("--paired-steps", type=int, default=100, help="run 3, per model, at least")
    p.add_argument(
        "--paired-seconds",
        type=float,
        default=0.0,
        help="run 3 goes on until plain DDP's timed steps add up to this too (short steps get "
        "more pairs: a tighter interval for the same minutes)",
    )
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the models train (cuda: GPU rank modulo the GPUs there are)",
    )
    p.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default="gloo",
        help="the process group's backend (nccl needs --device cuda)",
    )
    p.add_argument("--json", default=None, help="also write every figure here")
    p.add_argument(
        "--log-dir",
        default=None,
        help="write rank 0's autotune log of runs 1 and 2 (screening, paired tests, the check) "
        "here, a file per model, world size and run",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=1800.0,
        help="seconds one run may take before its ranks are killed and the model is reported "
        "failed (the next one runs)",
    )
    p.add_argument(
        "--hook-only",
        action="store_true",
        help="run 3 alone, with autotune fixed on native (DDP's buckets): the hook's own cost",
    )
    p.add_argument(
        "--plan-file", default=None, help="run 3 alone, with autotune fixed on this plan (JSON)"
    )
    p.add_argument(
        "--compression",
        default="",
        help="wire dtypes the tuner may compress a size class to (bf16, fp16: Config.compression); "
        "none by default",
    )
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="take run 3's autotune steps apart: communication exposed after backward, the "
        "hook's calls, each message's time and its wait on peers; each arm's CPU a rank and "
        "the cores' idle time a step",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.hook_only and args.plan_file:
        p.error("--hook-only and --plan-file: choose one")
    if args.backend == "nccl" and args.device != "cuda":
        p.error("--backend nccl needs --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device")
    rows: list[dict[str, Any]] = []
    failed: list[str] = []
    for world_size in (int(w) for w in args.world_sizes.split(",")):
        for model in args.models.split(","):
            begin = time.perf_counter()
            try:
                row = (fixed_cost if args.hook_only or args.plan_file else cell)(
                    model, world_size, args
                )
            except RankFailure as exc:  # the next model may still run: a lease is short
                failed.append(f"{model} x{world_size}")
                print(
                    f"{model} x{world_size}: failed [{time.perf_counter() - begin:.0f} s]: {exc}",
                    flush=True,
                )
                continue
            rows.append(row)
            if args.hook_only or args.plan_file:
                h, n = row["hook"], row["noop"]
                arm = "hook on native" if args.hook_only else "hook on the plan"
                print(
                    f"{model} x{world_size}: {arm} / plain {h['median']:.3f} "
                    f"({h['low']:.3f}-{h['high']:.3f}), noop/plain {n['median']:.3f}, plain "
                    f"{row['plain_ms']:.1f} ms [{time.perf_counter() - begin:.0f} s]",
                    flush=True,
                )
                continue
            a = row["autotune"]
            print(
                f"{model} x{world_size}: autotune/plain {a['median']:.3f} "
                f"({a['low']:.3f}-{a['high']:.3f}), noop/plain {row['noop']['median']:.3f}, "
                f"locked at {row['locked_at']}; {row['verdict']} "
                f"[{time.perf_counter() - begin:.0f} s]",
                flush=True,
            )
            for duel in row["duels"]:
                print(f"    {duel}", flush=True)
            if row["bucket_duels"] is not None:
                print(
                    f"  unhooked after {row['aside_at']}; bucket paired tests (cap, won, ratio, "
                    f"pairs, why) over {row['bucket_iterations']} iterations: "
                    f"{row['bucket_duels']}",
                    flush=True,
                )
            print(
                f"  restart: locked at {row['restart_locked_at']}; {row['restart_verdict']}",
                flush=True,
            )
            for duel in row["restart_duels"]:
                print(f"    {duel}", flush=True)
            if row["restart_bucket_duels"] is not None:
                print(f"  restart's bucket paired tests: {row['restart_bucket_duels']}", flush=True)
            print(f"  paired run: {row['paired_verdict']}", flush=True)
            if args.json:  # after every cell: a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps(rows, indent=1))
    if not (args.hook_only or args.plan_file):
        print(markdown(rows))
    if args.breakdown:
        print(breakdown_markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if failed:
        print(f"failed: {', '.join(failed)} (above)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
