"""The models benchmarks/step_gain.py trains on a GPU (benchmarks/gpu_models.py) have the shapes
of GPT-2 small and ResNet-50, checked here without the memory or time of either: their
parameters counted on the meta device, their wiring into step_gain's batches run there too, and
what makes each what it is (causal attention, tied embeddings, the strides) on small versions."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn import functional

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gpu_models import GPT2, ResNet, gpt2, resnet50
from step_gain import _model_and_batch


def count(model: torch.nn.Module) -> tuple[int, int]:
    """(parameters, tensors); a tied tensor counts once, as DDP's buckets hold it once."""
    tensors = list(model.parameters())
    return sum(p.numel() for p in tensors), len(tensors)


def test_gpt2_small_has_gpt2_smalls_parameters() -> None:
    with torch.device("meta"):
        model = gpt2()
    # GPT-2 small: 124,439,808 parameters in 148 tensors (the output projection is the token
    # embedding's).
    assert count(model) == (124_439_808, 148)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.head.weight is model.wte.weight


def test_resnet50_has_resnet50s_parameters_and_strides() -> None:
    with torch.device("meta"):
        model = resnet50()
        x = torch.empty(1, 3, 224, 224)
        shapes = []
        h = functional.max_pool2d(model.bn1(model.conv1(x)), 3, 2, padding=1)
        for stage in model.stages:
            h = stage(h)
            shapes.append(tuple(h.shape))
        out = model(x)
    # torchvision's resnet50(): 25,557,032 parameters in 161 tensors.
    assert count(model) == (25_557_032, 161)
    assert shapes == [(1, 256, 56, 56), (1, 512, 28, 28), (1, 1024, 14, 14), (1, 2048, 7, 7)]
    assert tuple(out.shape) == (1, 1000)
    # The stride on the 3x3 convolution of each stage's first block (v1.5), not the 1x1.
    strides = {n: m.stride for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)}
    assert (strides["stages.1.0.conv1"], strides["stages.1.0.conv2"]) == ((1, 1), (2, 2))


def test_gpt2_is_causal_and_learns_through_its_tied_embedding() -> None:
    torch.manual_seed(0)
    model = GPT2(layers=2, width=32, heads=4, vocabulary=50, positions=16)
    tokens = torch.randint(0, 50, (2, 12))
    changed = tokens.clone()
    changed[:, -1] = (tokens[:, -1] + 1) % 50
    a, b = model(tokens).view(2, 12, 50), model(changed).view(2, 12, 50)
    assert torch.equal(a[:, :-1], b[:, :-1])  # no position sees a later one
    assert not torch.equal(a[:, -1], b[:, -1])
    functional.cross_entropy(model(tokens), tokens.flatten()).backward()
    grad = model.wte.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_a_small_resnet_trains() -> None:
    torch.manual_seed(0)
    model = ResNet((1, 1, 1, 1), classes=10)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    loss = functional.cross_entropy(model(x), y)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_step_gains_batches_fit_its_gpu_models() -> None:
    g = torch.Generator().manual_seed(0)
    with torch.device("meta"):
        model, batch = _model_and_batch("gpt2", 0)
    x, y = batch(g)
    assert (tuple(x.shape), tuple(y.shape)) == ((4, 512), (4 * 512,))
    assert torch.equal(x[:, 1:].flatten(), y.view(4, 512)[:, :-1].flatten())  # next tokens
    with torch.device("meta"):
        loss = functional.cross_entropy(model(x.to("meta")), y.to("meta"))
    assert loss.shape == ()
    model, batch = _model_and_batch("resnet50", 0)
    x, y = batch(g)
    assert (tuple(x.shape), tuple(y.shape)) == ((32, 3, 224, 224), (32,))
    assert count(model) == (25_557_032, 161)
