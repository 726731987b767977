"""PyTorch Lightning with autotune: one callback. Lightning starts the ranks itself.

    python examples/lightning_ddp.py                 # 2 CPU ranks (gloo), 200 steps
    python examples/lightning_ddp.py --devices 4 --steps 400

Needs `pip install -e plugins/autotune-lightning` (`make venv` installs it). Rank 0 prints the
plan and the measured gain at the end; the values autotune logs land in ``lightning_logs/``.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from autotune_lightning import AutotuneCallback


class Classifier(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
            torch.nn.ReLU(), torch.nn.Linear(width, 10),
        )  # fmt: skip

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--width", type=int, default=512)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps * args.devices * 32, 64, generator=g)
    y = (x @ torch.randn(64, 10, generator=g)).argmax(dim=1)  # a teacher's labels
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        max_steps=args.steps,
        callbacks=[AutotuneCallback()],  # the one line
        enable_checkpointing=False,
        log_every_n_steps=10,
    )
    trainer.fit(Classifier(args.width), DataLoader(TensorDataset(x, y), batch_size=32))


if __name__ == "__main__":
    main()
