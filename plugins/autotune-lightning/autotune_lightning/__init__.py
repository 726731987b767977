"""autotune for PyTorch Lightning: ``Trainer(strategy="ddp", callbacks=[AutotuneCallback()])``.

Lightning registers a DDP comm hook only on CUDA, and then with no state; this callback registers
autotune on the wrapped DDP model at fit start, on every accelerator, logs autotune's values to
the trainer's loggers as it trains, and closes it when fitting ends. docs/INTEGRATIONS.md.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from autotune import AutotuneState, Config
from autotune.frameworks import attach, detach, log_values, plan_text, summary_lines

__all__ = ["AutotuneCallback"]


class AutotuneCallback(Callback):
    """Registers autotune on the strategy's DDP model when fitting starts.

    ``config``: autotune's (None: from ``AUTOTUNE_*`` variables). ``state`` is autotune's state
    once fitting has started (kept, closed, after it ends: its plan and stats stay readable).
    Logged on every training step, under ``autotune/``: `autotune.frameworks.log_values`; at the
    end, the plan as the hyperparameter ``autotune/plan``, and rank 0 prints the measured gain.
    """

    def __init__(self, config: Config | None = None) -> None:
        self.config = config
        self.state: AutotuneState | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.world_size < 2:
            rank_zero_warn("autotune: a single process has no gradient all-reduce to tune")
            return
        # Lightning has wrapped the module by now (strategy.setup runs before on_fit_start).
        self.state = attach(trainer.strategy.model, self.config)

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.state is not None:
            # The same on every rank (the tuner's state is agreed): rank 0 logs it.
            pl_module.log_dict(log_values(self.state), rank_zero_only=True)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        state = self.state
        if state is None:
            return
        plan = plan_text(state)
        for logger in trainer.loggers:
            logger.log_hyperparams({"autotune/plan": plan})
        for line in summary_lines(state):
            rank_zero_info(line)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._close()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self._close()

    def _close(self) -> None:
        if self.state is not None:
            detach(self.state)
