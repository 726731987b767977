"""A model with a sparse gradient, in torch alone (no autotune): the sparse tests' jobs
(tests/jobs/fault_jobs.py) train it, and tools/gloo_sparse_crash.py crashes PyTorch with it."""

from __future__ import annotations

import torch


class SparseNet(torch.nn.Module):
    """A recommender's shape: a sparse embedding (its gradient a sparse COO tensor), a dense
    head, and a second, dense embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.sparse = torch.nn.Embedding(1000, 16, sparse=True)
        self.dense = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, ids: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.sparse(ids).sum(1), self.dense(other).sum(1)], dim=1)
        out: torch.Tensor = self.head(h)
        return out
