"""backward() through the guards' wrapper (`autotune.ddp.guard`): a backend's error becomes the
`PeerError` a live guard diagnoses; any other error passes as it was; nothing stays installed.

The wrapper is checked here with a stand-in guard; tests/ddp/test_faults_unhooked.py runs real
guards on real ranks."""

from __future__ import annotations

import pytest
import torch

from autotune.algorithms import PeerError
from autotune.ddp import guard


class StandIn:
    """A guard whose model runs without the hook: it diagnoses what `Guard.translate` would."""

    def __init__(self) -> None:
        self.seen: list[BaseException] = []

    def translate(self, error: BaseException) -> PeerError | None:
        if not guard._from_backend(error):
            return None
        self.seen.append(error)
        return PeerError("native all-reduce failed: rank 1 failed first (stand-in)", rank=1)


def _backward_raising(error: BaseException) -> None:
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).sum()

    def fail(grad: torch.Tensor) -> torch.Tensor:
        raise error

    y.register_hook(fail)
    y.backward()


def test_a_backend_error_in_backward_becomes_the_peer_error() -> None:
    original = torch.autograd._engine_run_backward  # type: ignore[attr-defined]
    stand_in = StandIn()
    guard.install(stand_in)  # type: ignore[arg-type]
    try:
        assert torch.autograd._engine_run_backward is guard._run_backward  # type: ignore[attr-defined]
        gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
        with pytest.raises(PeerError) as raised:
            _backward_raising(gloo)
        assert raised.value.rank == 1 and raised.value.__cause__ is stand_in.seen[0]
        # The user's own errors pass as they were, untouched.
        with pytest.raises(ValueError, match="shape mismatch"):
            _backward_raising(ValueError("shape mismatch"))
        with pytest.raises(RuntimeError, match=r"^a user's error$"):
            _backward_raising(RuntimeError("a user's error"))
        # A backward pass that does not fail runs as before.
        x = torch.ones(2, requires_grad=True)
        (x * 3).sum().backward()
        assert x.grad is not None and x.grad.tolist() == [3.0, 3.0]
    finally:
        guard.uninstall(stand_in)  # type: ignore[arg-type]
    assert torch.autograd._engine_run_backward is original  # type: ignore[attr-defined]
