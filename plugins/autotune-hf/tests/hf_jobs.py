"""Jobs for the Hugging Face tests, run on each rank by `autotune.comm.launch.run_local` (gloo,
127.0.0.1): the same small training with and without autotune, through Accelerate and through the
Transformers Trainer."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset, TensorDataset

import autotune
import autotune_hf

STEPS = 30
ACCUMULATE = 2  # micro-batches per optimizer step: every other backward runs under no_sync


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 4),
    )  # fmt: skip


def accelerate_job(rank: int, world_size: int, config: autotune.Config | None) -> dict[str, Any]:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * ACCUMULATE * world_size * 8, 32, generator=g)
    y = torch.tanh(x @ torch.randn(32, 4, generator=g))
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    state = None if config is None else autotune_hf.register(accelerator, model, config)
    for x_b, y_b in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x_b), y_b)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    out: dict[str, Any] = {
        "parameters": [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    }
    if state is not None:
        state.engine.settle(timeout_s=10.0)
        out["iterations"] = state.engine.iteration
        out["messages"] = len(state.recorder.records())
        out["plan"] = state.plan()
        state.close()
    # DDP's reducer holds the process group. Freed after end_training had destroyed the group,
    # it ran the group's destructor holding the GIL, which waits for the group's worker thread,
    # which needed the GIL to release its last work: a hang, once (a torch race, the kind of
    # pytorch/pytorch#56297). So the model goes while the group is up.
    state = None
    model, optimizer, loader = accelerator.free_memory(model, optimizer, loader)
    accelerator.end_training()
    return out


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences labelled by a fixed rule (no downloads: there is no network)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(2)
        self.ids = torch.randint(0, 100, (n, 16), generator=g)
        self.labels = (self.ids[:, 0] > 50).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def trainer_job(
    rank: int, world_size: int, out: str, config: autotune.Config | None
) -> dict[str, Any]:
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    import autotune_hf.trainer

    logged: list[dict[str, float]] = []

    class Keep(TrainerCallback):  # stands for a report_to integration: after autotune's
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            logged.append(dict(logs or {}))

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128, max_position_embeddings=32,  # 2 labels: the default
        )
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=out,
        use_cpu=True,
        ddp_backend="gloo",
        max_steps=STEPS,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(STEPS * 8 * world_size))
    trainer.add_callback(Keep())
    callback = None if config is None else autotune_hf.trainer.register(trainer, config)
    trainer.train()
    result: dict[str, Any] = {
        "parameters": [p.detach().clone() for p in model.parameters()],
        "logged": logged,
    }
    if callback is not None:
        assert callback.state is not None
        result["messages"] = len(callback.state.recorder.records())
        result["plan"] = callback.state.plan()
    return result
