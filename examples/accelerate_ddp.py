"""Hugging Face Accelerate with autotune: register on the model `prepare` returned.

    torchrun --nproc-per-node 2 examples/accelerate_ddp.py       # 2 CPU ranks (gloo)
    accelerate launch --cpu --num_processes 2 examples/accelerate_ddp.py

Needs `pip install -e plugins/autotune-hf` (`make venv` installs it). Gradient accumulation
(`accelerator.accumulate`) keeps working: the steps that skip synchronising send nothing.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

import autotune_hf
from autotune.frameworks import summary_lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--accumulate", type=int, default=2, help="micro-batches per step")
    args = p.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    g = torch.Generator().manual_seed(0)
    n = args.steps * args.accumulate * accelerator.num_processes * 32
    x = torch.randn(n, 64, generator=g)
    y = (x @ torch.randn(64, 10, generator=g)).argmax(dim=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    state = autotune_hf.register(accelerator, model)  # the one line
    for step, (xb, yb) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if state is not None and step % 50 == 0:
            autotune_hf.log(accelerator, state, step)  # to the trackers you configured
    if state is not None:
        if accelerator.is_main_process:
            print("\n".join(summary_lines(state)))  # the plain verdict first
        state.close()
    accelerator.print(f"loss at the end: {loss.item():.3f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
