"""autotune for the Transformers ``Trainer``: ``autotune_hf.trainer.register(trainer)``.

The Trainer wraps its model in DDP (through Accelerate) when training starts and hands callbacks
only the unwrapped model, so the callback keeps the trainer and takes ``trainer.model_wrapped``.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from autotune import AutotuneState, Config
from autotune.frameworks import attach, detach, log_values, summary_lines

__all__ = ["AutotuneTrainerCallback", "register"]


class AutotuneTrainerCallback(TrainerCallback):
    """Registers autotune on the Trainer's DDP model when training begins; adds autotune's values
    to every log (so every ``report_to`` integration gets them); closes it when training ends.

    ``state`` is autotune's state once training has begun (kept, closed, after it ends).
    """

    def __init__(self, trainer: Trainer, config: Config | None = None) -> None:
        self.trainer = trainer
        self.config = config
        self.state: AutotuneState | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if args.world_size < 2:
            return
        # The Trainer has prepared (wrapped) its model by now.
        self.state = attach(self.trainer.model_wrapped, self.config)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **_: Any,
    ) -> None:
        if self.state is not None and logs is not None:
            logs.update(log_values(self.state))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if self.state is None:
            return
        if state.is_world_process_zero:
            print("\n".join(summary_lines(self.state)))
        detach(self.state)


def register(trainer: Trainer, config: Config | None = None) -> AutotuneTrainerCallback:
    """Add the callback to ``trainer``, first, so the values it adds to a log reach the
    logging integrations (``report_to``) that come after it; returns it."""
    callback = AutotuneTrainerCallback(trainer, config)
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
