"""The Transformers Trainer with autotune: one call before `train()`. A tiny BERT built from a
config (nothing downloaded), on random token sequences with a learnable rule.

    torchrun --nproc-per-node 2 examples/hf_trainer.py           # 2 CPU ranks (gloo)

Needs `pip install -e "plugins/autotune-hf[trainer]"` (`make venv` installs it). autotune's
values join every log the Trainer writes (so every ``report_to`` integration gets them); rank 0
prints the plan and the measured gain at the end.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import autotune_hf.trainer


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 1000, (n, 32), generator=g)
        self.labels = (self.ids[:, 0] > 500).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=256, max_position_embeddings=64,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out, use_cpu=True, ddp_backend="gloo", max_steps=args.steps,
            per_device_train_batch_size=16, logging_steps=50, save_strategy="no",
            report_to="none",
        )  # fmt: skip
        trainer = Trainer(
            model=BertForSequenceClassification(config),
            args=training,
            train_dataset=Tokens(args.steps * 16 * training.world_size),
        )
        autotune_hf.trainer.register(trainer)  # the one line
        trainer.train()


if __name__ == "__main__":
    main()
