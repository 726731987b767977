"""torch.compile on a DDP model with autotune's hook: DDP's graph-splitting optimizer (the
default) and compiled autograd both train through autotune like plain DDP. DDP's Python reducer
(``optimize_ddp="python_reducer"``) is refused at registration: test_hook.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp_jobs import compiled_training
from unhook_jobs import KEEPS_BASELINE

from autotune.comm.launch import run_local

pytestmark = pytest.mark.distributed

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


def test_compiled_ddp_steps_aside_like_eager_ddp(tmp_path: Path) -> None:
    # The tuner can only keep the baseline: autotune unhooks, and the compiled model (DDP's
    # graph optimizer) trains on under the new reducer as plain compiled DDP does.
    options = {"timeout_s": 300, "env": {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}}
    settings = {**KEEPS_BASELINE, "storage": f"sqlite:///{tmp_path / 'tuning.db'}"}
    steps = 100  # the tuner locks at 10-30 here; room for a loaded machine
    tuned = run_local(compiled_training, 2, "auto", "inductor", False, settings, steps, **options)
    plain = run_local(compiled_training, 2, None, "inductor", False, None, steps, **options)
    at = {rank["aside_at"] for rank in tuned}
    assert len(at) == 1 and None not in at, at
    (aside_at,) = at
    assert aside_at is not None and aside_at < steps - 10
    for rank in tuned:
        assert rank["iterations"] == aside_at  # no bucket reached the hook after it
    mine = tuned[0]["parameters"]
    assert all(torch.equal(a, b) for a, b in zip(mine, tuned[1]["parameters"], strict=True))
    for a, b in zip(mine, plain[0]["parameters"], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a - b).abs().max()
