"""The GPU machine as autotune sees it (benchmarks/gpu_checks.sh, phase ``env``): Python, torch,
CUDA, the NCCL torch was built with and the one it runs, the GPU series as a scrape of real NVML
shows them, and step_gain's ResNet-50 (benchmarks/gpu_models.py) against torchvision's."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry, generate_latest

import autotune
from autotune.comm.nccl_version import runtime_version
from autotune.metrics import NvmlMetrics, PynvmlQuery


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
    cuda = torch.cuda.is_available()
    print("devices", torch.cuda.device_count(), torch.cuda.get_device_name(0) if cuda else None)
    built = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    print("nccl: torch built with", built, "runs", runtime_version())
    import optuna

    print("autotune", autotune.__version__, "optuna", optuna.__version__)
    # Only a fake NVML has fed these series anywhere else.
    print(PynvmlQuery().readings())
    registry = CollectorRegistry()
    registry.register(NvmlMetrics())
    print(generate_latest(registry).decode())
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_models import resnet50

    try:
        import torchvision
    except ImportError as exc:
        print("resnet50: torchvision not there to compare:", exc)
        return
    theirs = [tuple(p.shape) for p in torchvision.models.resnet50().parameters()]
    ours = [tuple(p.shape) for p in resnet50().parameters()]
    print("resnet50: the same tensors as torchvision", torchvision.__version__, ours == theirs)


if __name__ == "__main__":
    main()
