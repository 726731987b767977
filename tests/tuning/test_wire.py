"""The tuner's exchange row: what the MAX all-reduce of every rank's row reads back as."""

from __future__ import annotations

import torch

from autotune.plan import Gain
from autotune.tuning import wire


def exchanged(*windows: wire.Window, orders: wire.Orders | None = None) -> list[float]:
    """The rows of ranks 0, 1, ... (rank 0's with ``orders``), all-reduced with MAX in float64 as
    the tuner's group does."""
    rows = [wire.write(w, orders if rank == 0 else None) for rank, w in enumerate(windows)]
    for row in rows:
        assert len(row) == wire.WIDTH
    return torch.tensor(rows, dtype=torch.float64).amax(dim=0).tolist()


def test_latency_is_the_least_over_ranks_and_the_step_the_most() -> None:
    # Rank 1 came last to every message: its latencies are the smallest.
    window, orders = wire.read(
        exchanged(
            wire.Window({1 << 20: 0.030, 1 << 24: 0.055}, 0.170),
            wire.Window({1 << 20: 0.004, 1 << 24: 0.016}, 0.181),
            wire.Window({1 << 20: 0.011, 1 << 24: 0.040}, 0.175),
        )
    )
    assert window.latencies == {1 << 20: 0.004, 1 << 24: 0.016}
    assert window.step_s == 0.181
    assert orders is None


def test_a_class_one_rank_did_not_measure_is_the_others_and_none_measured_is_absent() -> None:
    window, _ = wire.read(
        exchanged(
            wire.Window({1 << 20: 0.002}, None),
            wire.Window({1 << 20: 0.003, 1 << 10: 0.0001}, None),
        )
    )
    assert window.latencies == {1 << 20: 0.002, 1 << 10: 0.0001}
    assert window.step_s is None
    assert wire.read(exchanged(wire.Window({}, None), wire.Window({}, None)))[0].latencies == {}


def test_zero_latency_is_a_measurement() -> None:
    window, _ = wire.read(exchanged(wire.Window({1: 0.0}, 0.0), wire.Window({1: 0.5}, 0.0)))
    assert window.latencies == {1: 0.0}
    assert window.step_s == 0.0


def test_rank_zeros_orders_reach_every_rank_beside_the_windows() -> None:
    orders = wire.Orders(
        codes={1 << 20: 3, 1 << 24: 1},
        states={1 << 20: "locked", 1 << 24: "exploring"},
        fusion_bytes=4 << 20,
        cadence=wire.LOCKED,
        phase="classes",
        gain=Gain(0.93, 0.91, 0.96, 24),
        to_go=118,
        check_steps=2,
    )
    window, got = wire.read(
        exchanged(
            wire.Window({1 << 24: 0.02}, 0.1), wire.Window({1 << 24: 0.01}, 0.2), orders=orders
        )
    )
    assert got == orders
    assert window.latencies == {1 << 24: 0.01} and window.step_s == 0.2


def test_an_estimate_of_none_and_of_zero_iterations_left_both_cross_the_wire() -> None:
    for to_go in (None, 0):
        orders = wire.Orders({}, {}, 0, wire.EXPLORING, "loading", None, to_go=to_go)
        assert wire.read(exchanged(wire.Window({}, None), orders=orders))[1] == orders
