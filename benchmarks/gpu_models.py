"""Models sized for a GPU, for benchmarks/step_gain.py: GPT-2 small and ResNet-50.

What autotune sees of a model is its gradients: the tensors' shapes, their order and dtype, which
make DDP's buckets. These two have the shapes of the models users know, built from torch alone
(no hub, no weights, no torchvision: a CPU-only torch cannot import the CUDA build of
torchvision that PyPI serves, and the suite runs without a GPU):

- `gpt2`: GPT-2 small, 12 layers of width 768 with 12 heads, a 50257-token vocabulary and 1024
  positions, the output projection tied to the token embedding: 124,439,808 parameters, as
  GPT-2 small has, trained in bf16 by default.
- `resnet50`: ResNet-50 (bottleneck blocks 3, 4, 6, 3; the stride on the 3x3 convolution, as
  torchvision's v1.5), 1000 classes: 25,557,032 parameters, tensor for tensor torchvision's
  ``resnet50()`` (benchmarks/gpu_checks.sh's env phase compares the two where torchvision
  imports).

Example::

    >>> model = gpt2()  # GPT-2 small
    >>> logits = model(tokens)  # (batch * positions, vocabulary): cross-entropy takes it as is
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

__all__ = ["GPT2", "ResNet", "gpt2", "resnet50"]


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Linear(width, 3 * width)  # query, key and value of every head
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, positions, width = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(width, dim=2)
        shape = (batch, positions, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, positions, width))
        out: torch.Tensor = x + self.fc_proj(
            functional.gelu(self.fc(self.ln_2(x)), approximate="tanh")
        )
        return out


class GPT2(nn.Module):
    """A decoder-only transformer of GPT-2's design; `forward` gives every position's logits,
    flattened to (batch * positions, vocabulary)."""

    def __init__(
        self,
        layers: int = 12,
        width: int = 768,
        heads: int = 12,
        vocabulary: int = 50257,
        positions: int = 1024,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocabulary, width)
        self.wpe = nn.Embedding(positions, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2's

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        where = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(where)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits.flatten(0, 1)


def gpt2(dtype: torch.dtype = torch.bfloat16, **shape: int) -> GPT2:
    """GPT-2 small (or ``shape``'s overrides of `GPT2`'s), its parameters in ``dtype``."""
    return GPT2(**shape).to(dtype)


class _Bottleneck(nn.Module):
    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        outputs = 4 * width
        self.conv1 = nn.Conv2d(inputs, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, outputs, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(outputs)
        self.downsample: nn.Module | None = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(
                nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = functional.relu(self.bn1(self.conv1(x)))
        y = functional.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return functional.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """A bottleneck ResNet: ``blocks`` per stage, widths 64, 128, 256, 512 (times 4 out)."""

    def __init__(self, blocks: tuple[int, ...] = (3, 4, 6, 3), classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages: list[nn.Module] = []
        inputs = 64
        for i, count in enumerate(blocks):
            width = 64 << i
            stage = []
            for j in range(count):
                stage.append(_Bottleneck(inputs, width, 2 if j == 0 and i > 0 else 1))
                inputs = 4 * width
            stages.append(nn.Sequential(*stage))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(inputs, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = functional.max_pool2d(functional.relu(self.bn1(self.conv1(x))), 3, 2, padding=1)
        x = self.stages(x)
        logits: torch.Tensor = self.fc(torch.flatten(functional.adaptive_avg_pool2d(x, 1), 1))
        return logits


def resnet50(classes: int = 1000) -> ResNet:
    """ResNet-50, in float32."""
    return ResNet((3, 4, 6, 3), classes)
