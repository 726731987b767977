"""torch.compile on a DDP model with autotune's hook: DDP's graph-splitting optimizer (the
default) and compiled autograd both train through autotune like plain DDP. DDP's Python reducer
(``optimize_ddp="python_reducer"``) is refused at registration: test_hook.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp_jobs import compiled_training

from autotune.launch import run_local

STEPS = 30


@pytest.mark.parametrize(
    ("backend", "compiled_autograd"),
    [("inductor", False), ("aot_eager", True)],
    ids=["inductor", "compiled-autograd"],
)
def test_compiled_ddp_trains_through_autotune_like_plain_ddp(
    tmp_path: Path, backend: str, compiled_autograd: bool
) -> None:
    # Inductor's generated code goes to the test's directory, not the machine's /tmp.
    options = {"timeout_s": 300, "env": {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}}
    tuned = run_local(compiled_training, 2, "ring", backend, compiled_autograd, **options)
    plain = run_local(compiled_training, 2, None, backend, compiled_autograd, **options)
    for rank in tuned:
        assert rank["iterations"] == STEPS  # every backward reached the hook
        assert rank["messages"] >= STEPS
    mine = tuned[0]["parameters"]
    assert all(torch.equal(a, b) for a, b in zip(mine, tuned[1]["parameters"], strict=True))
    for a, b in zip(mine, plain[0]["parameters"], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a - b).abs().max()
