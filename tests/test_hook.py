"""The comm hook in real DDP jobs on spawned gloo ranks: the same training as DDP's own all-reduce.

Each job trains one model with autotune's hook and an identical one with DDP's own all-reduce,
side by side, on the same data for 30 steps.
"""

from __future__ import annotations

import functools

import pytest
import torch
from ddp_jobs import (
    VARIANTS,
    Trained,
    bf16_gradient_error,
    die_mid_training,
    digest,
    env_default_state,
    overlap_events,
    records,
    register_twice,
    train_all,
)

from autotune.algorithms import available
from autotune.launch import launch, run_local
from autotune.plan import size_class

ALGORITHMS = available()
FP32_VARIANTS = [name for name, v in VARIANTS.items() if v.dtype == torch.float32]


@functools.cache
def trained(world_size: int, variants: tuple[str, ...]) -> tuple[list[Trained], ...]:
    # One world trains every algorithm under every variant: starting ranks is the slow part.
    return tuple(run_local(train_all, world_size, ALGORITHMS, list(variants), timeout_s=600))


def check(per_rank: tuple[list[Trained], ...], algorithm: str, variant: str) -> None:
    runs = [
        next(t for t in ts if t.algorithm == algorithm and t.variant == variant) for ts in per_rank
    ]
    # Every rank ends with bitwise the same parameters.
    assert len({digest(t.hooked) for t in runs}) == 1, "ranks disagree"
    mine = runs[0]
    for hooked, plain in zip(mine.hooked, mine.plain, strict=True):
        # The same training as DDP's own all-reduce, to 1e-5 relative (the sums differ only in
        # the order of additions: about 1e-7 here).
        rel = float((hooked.double() - plain.double()).norm() / plain.double().norm())
        assert rel <= 1e-5, f"{algorithm}/{variant}: {rel:.2e} from DDP without the hook"
    if algorithm == "native" and VARIANTS[variant].fusion_bytes == 0:
        # Same collective, same scaling as DDP: bitwise DDP's result.
        assert all(torch.equal(h, p) for h, p in zip(mine.hooked, mine.plain, strict=True))
    assert mine.messages > 0 and mine.algorithms_used == {algorithm}


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matches_ddp(algorithm: str, world_size: int) -> None:
    check(trained(world_size, ("base",)), algorithm, "base")


@pytest.mark.parametrize("variant", [v for v in FP32_VARIANTS if v != "base"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matches_ddp_under_ddp_options(algorithm: str, variant: str) -> None:
    check(trained(3, tuple(v for v in FP32_VARIANTS if v != "base")), algorithm, variant)


def test_fusion_and_splitting_change_the_messages() -> None:
    per_rank = trained(3, tuple(v for v in FP32_VARIANTS if v != "base"))
    base = trained(3, ("base",))[0][0]
    runs = {t.variant: t for t in per_rank[0] if t.algorithm == "ring"}
    # Tiny DDP buckets (about 3 a step), fused up to 64 KiB, above the whole 23 KiB gradient:
    # one message per step, the same bytes.
    assert runs["small_buckets"].messages > 2 * 30
    assert runs["fuse_small_buckets"].messages == 30
    assert runs["fuse_small_buckets"].message_bytes == runs["small_buckets"].message_bytes
    # DDP's one ~22 KiB bucket cut into pieces of at most 3000 bytes.
    assert runs["split_large_buckets"].messages >= 8 * base.messages
    assert max(runs["split_large_buckets"].plan_classes) <= 4096
    assert runs["split_large_buckets"].message_bytes == base.message_bytes


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_bf16_model(world_size: int) -> None:
    """A bf16 model: every step's averaged gradient within the proven bf16 bound.

    Thirty-step trajectories are not compared here: in bf16 a one-ulp difference in a gradient
    flips the rounding of parameters, and two correct summation orders drift apart by several
    percent within 30 steps (measured: 6-8% for every algorithm against DDP's ring). `native`,
    which sums exactly as DDP does, is held to bitwise equality over 30 steps in
    `test_bf16_native_is_ddp`.
    """
    per_rank = run_local(bf16_gradient_error, world_size, ALGORITHMS)
    for algorithm in ALGORITHMS:
        worst, _ = per_rank[0][algorithm]
        assert worst <= 1.0, f"{algorithm}: {worst:.3g}x the bf16 error bound"
        assert len({r[algorithm][1] for r in per_rank}) == 1, f"{algorithm}: ranks disagree"


def test_bf16_native_is_ddp() -> None:
    per_rank = run_local(train_all, 3, ["native"], ["bf16"])
    mine = per_rank[0][0]
    assert all(torch.equal(h, p) for h, p in zip(mine.hooked, mine.plain, strict=True))
    assert len({digest(ts[0].hooked) for ts in per_rank}) == 1


def test_state_from_environment() -> None:
    env = {"AUTOTUNE_ALGORITHM": "two_tree", "AUTOTUNE_FUSION_BYTES": "8K"}
    results = run_local(env_default_state, 2, env=env)
    assert results == [({"two_tree"}, 8192, "two_tree")] * 2


def test_second_registration_keeps_ddps_error() -> None:
    messages = run_local(register_twice, 2)
    for msg in messages:
        assert "can only be called once" in msg, msg


def test_dead_rank_makes_the_others_raise_within_the_timeout() -> None:
    timeout_s = 4.0
    results = launch(die_mid_training, 3, 2, timeout_s, timeout_s=120, grace_s=60)
    assert results[2].exitcode == 17
    for r in results[:2]:
        assert r.ok, r.error
        step, message, seconds = r.value
        assert step == 5, message
        assert "ring all-reduce" in message
        assert "0:00:04" in message or "closed" in message.lower() or "reset" in message.lower()
        assert seconds < timeout_s + 3.0, f"rank {r.rank} took {seconds:.1f}s"
    # The ranks next to the dead one name it.
    assert any("rank 2" in r.value[1] for r in results[:2])


def test_backward_overlaps_communication() -> None:
    """Shown with events, not timed: backward runs on while a message is pending, and messages
    complete while backward still runs (benchmarks/overlap.py measures how much is hidden)."""
    for opened, completed_during_backward, messages in run_local(overlap_events, 2):
        assert messages >= 4
        # The step's first message waited for a gate that only backward's last gradient opens:
        # had the hook run it on the autograd thread, the gate would never have opened.
        assert opened == [True]
        # That late gradient hook saw a message complete before backward went on.
        assert completed_during_backward


def test_every_message_is_recorded_and_summarized() -> None:
    per_rank = run_local(records, 3, ["native", "ring"])
    for algorithm in ("native", "ring"):
        recs, stats, plan, hook_times = per_rank[0][algorithm]
        assert len(recs) >= 6 * 2
        assert {r.iteration for r in recs} == set(range(6))
        for r in recs:
            assert r.algorithm == algorithm and r.world_size == 3
            assert r.size_class == size_class(r.nbytes) and r.seconds > 0
            # Time waiting for the first peer: observable on our P2P path, not inside gloo's.
            assert (r.first_wait_s is None) == (algorithm == "native")
        assert sum(s.count for s in stats.values()) == len(recs)
        assert sum(s.bytes for s in stats.values()) == sum(r.nbytes for r in recs)
        assert {cls for cls, _ in stats} == set(plan)
        for s in stats.values():
            assert 0 < s.median_s <= s.p99_s and s.busbw_gbps > 0
        assert len(hook_times) == len(recs)  # one hook call per bucket; no fusion here
        # Ranks record the same messages (sizes and order), if not the same times.
        for other in per_rank[1:]:
            assert [r.nbytes for r in other[algorithm][0]] == [r.nbytes for r in recs]
