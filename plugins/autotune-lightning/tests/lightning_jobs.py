"""Jobs for the Lightning tests, run on each rank by `autotune.comm.launch.run_local` (gloo,
127.0.0.1): the same small fit with and without the callback."""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import lightning_utilities.core.rank_zero as rank_zero
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

import autotune
from autotune_lightning import AutotuneCallback

STEPS = 30


class Regressor(pl.LightningModule):
    """An MLP fitting a fixed random teacher: buckets of several sizes, a loss that falls."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
            torch.nn.ReLU(), torch.nn.Linear(256, 4),
        )  # fmt: skip

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data() -> DataLoader[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * 2 * 16, 32, generator=g)
    y = torch.tanh(x @ torch.randn(32, 4, generator=g))
    # Lightning adds a DistributedSampler: each rank gets its half.
    return DataLoader(TensorDataset(x, y), batch_size=16)


class _Said(logging.Handler):
    """What rank_zero_info said, autotune's lines only."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("autotune"):
            self.lines.append(record.getMessage())


def fit(rank: int, world_size: int, out: str, config: autotune.Config | None) -> dict[str, Any]:
    said = _Said()
    log = logging.getLogger(rank_zero.log.name)
    log.addHandler(said)
    level, log.level = log.level, logging.INFO
    try:
        result = _fit(world_size, out, config)
    finally:
        log.removeHandler(said)
        log.setLevel(level)
    result["said"] = said.lines
    return result


def _fit(world_size: int, out: str, config: autotune.Config | None) -> dict[str, Any]:
    module = Regressor()
    callbacks = [] if config is None else [AutotuneCallback(config)]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy="ddp",
        max_steps=STEPS,
        logger=CSVLogger(out, name="run"),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,  # type: ignore[arg-type]
    )
    trainer.fit(module, data())
    result: dict[str, Any] = {
        "parameters": [p.detach().clone() for p in module.parameters()],
        "log_dir": trainer.logger.log_dir if trainer.logger is not None else None,
    }
    if callbacks:
        state = callbacks[0].state
        assert state is not None
        result["messages"] = len(state.recorder.records())
        result["plan"] = state.plan()
    return result
