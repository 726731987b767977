"""How many iterations autotune takes to a final decision, from an empty storage and resumed.

    python benchmarks/decision_iterations.py --world-size 4 --models mlp,transformer,convnet

Per model (benchmarks/step_gain.py's), three jobs of autotune alone on spawned CPU ranks (gloo,
127.0.0.1, one intra-op thread per rank), each stopping once `state.status()` is final (the
same iteration on every rank) or at its cap:

1. empty: from an empty storage, up to ``--cap`` iterations;
2. short: from another empty storage, a job of ``--short`` iterations, which ends where it is
   (provisional, most often: what it learned is stored, `autotune.tuning.tuner`);
3. resumed: the next job on run 2's storage, up to ``--cap``.

Printed per model: the iterations each took (the iteration after which its status was final;
"-" where it was not final at the cap), the headline it ended with, where run 2 ended, and per
run the iterations spent in each stage (the first of `Status.to_run`, or the phase).
Iterations, not seconds, are the figure: how long an iteration takes is the model's.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.comm.launch import run_local
from autotune.testing.settled import everywhere

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_gain import MODELS, _step, model_and_batch


def job(
    rank: int,
    world_size: int,
    model: str,
    storage: str,
    cap: int,
    log: bool = False,
    settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Train ``model`` with autotune until its status is final, or ``cap`` iterations (``log``:
    rank 0 prints autotune's INFO log, each paired test and the check among it; ``settings``:
    `autotune.Config` fields other than the defaults, as ``AUTOTUNE_`` variables)."""
    torch.set_num_threads(1)
    if log and rank == 0:
        logging.basicConfig(level=logging.WARNING, format="  [rank 0] %(message)s")
        logging.getLogger("autotune").setLevel(logging.INFO)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    net, batch = model_and_batch(model)
    ddp = DDP(net, bucket_cap_mb=1.0 if model == "mlp" else None)  # as step_gain.py runs them
    config = autotune.Config.from_env(settings or {}, storage=storage, timeout_s=120)
    state = autotune.register(ddp, config)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    final_at = None
    stages: dict[str, int] = {}  # iterations spent in each stage (what the status ran)
    for step in range(cap):
        x, y = batch(g)
        _step(ddp, opt, x, y)
        now = state.status()
        stage = now.to_run[0].split(" (")[0] if now.to_run else now.phase
        stages[stage] = stages.get(stage, 0) + 1
        if everywhere(now.final):
            final_at = step + 1
            break
    now = state.status()
    out = {"final_at": final_at, "headline": now.headline, "phase": now.phase, "stages": stages}
    state.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--cap", type=int, default=1000, help="runs 1 and 3, at most")
    p.add_argument("--short", type=int, default=150, help="run 2's length")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--log", action="store_true", help="rank 0 prints autotune's INFO log")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="an autotune.Config field, as its AUTOTUNE_ variable takes it (tune_warmup=1)",
    )
    args = p.parse_args(argv)
    settings = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set {item}: FIELD=VALUE")
        settings[f"AUTOTUNE_{field.upper()}"] = value
    autotune.Config.from_env(settings)  # a bad setting stops here, not in every rank

    def one_job(model: str, storage: str, cap: int) -> dict[str, Any]:
        """One job of ``model`` on ``storage`` (rank 0's figures)."""
        ranks: list[dict[str, Any]] = run_local(
            job, args.world_size, model, storage, cap, args.log, settings, timeout_s=3600
        )
        return ranks[0]

    rows = []
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            empty = f"sqlite:///{Path(tmp) / 'empty.db'}"
            resumed = f"sqlite:///{Path(tmp) / 'resumed.db'}"
            first, short, then = (
                one_job(model, empty, args.cap),
                one_job(model, resumed, args.short),
                one_job(model, resumed, args.cap),
            )
        row = {"model": model, "empty": first, "short": short, "resumed": then}
        rows.append(row)
        print(
            f"{model}: from empty {first['final_at'] or '-'} iterations ({first['headline']}); "
            f"a {args.short}-iteration job ended {short['phase']} "
            f"({'final' if short['final_at'] else 'provisional'}); the next one resumed and took "
            f"{then['final_at'] or '-'} ({then['headline']})",
            flush=True,
        )
        for name, run in (("empty", first), ("short", short), ("resumed", then)):
            spent = ", ".join(f"{stage} {n}" for stage, n in run["stages"].items())
            print(f"  {name}: {spent}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
