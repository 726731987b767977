"""The cost model's arithmetic by hand, and its counts against the schedules the algorithms run."""

from __future__ import annotations

import math

import pytest

from autotune.algorithms import binary_tree, double_binary_tree, split
from autotune.algorithms._trees import _tree_rounds
from autotune.model import Link, Params, Shape, bytes_sent, predict, schedule

MIB = 1 << 20
US, NS = 1e-6, 1e-9


def test_two_ranks_on_one_node_by_hand() -> None:
    params = Params(intra=Link(10 * US, 1 * NS), inter=Link(1.0, 1.0), gamma_s_per_byte=0.5 * NS)
    one_node = Shape(2, 2)
    a, b, g = 10 * US, 1 * NS, 0.5 * NS
    s, seg = 8 * MIB, 4 * MIB

    def cost(name: str) -> float:
        return predict(name, s, one_node, params, segment_bytes=seg)

    # Ring: chunks of 4 MiB, one segment each; one step sums, one copies.
    assert cost("ring") == pytest.approx(2 * a + 2 * 4 * MIB * b + 4 * MIB * g)
    # Tree 0 -> 1: two 4 MiB segments; up in rounds 0-1, down in 1-2.
    assert cost("tree") == pytest.approx(3 * a + 3 * 4 * MIB * b + 2 * 4 * MIB * g)
    # Two trees of 4 MiB each, one segment: each rank sends up one tree and down the other.
    assert cost("two_tree") == pytest.approx(2 * a + 2 * 8 * MIB * b + 1 * 4 * MIB * g)
    assert cost("direct") == pytest.approx(a + 8 * MIB * b + 8 * MIB * g)
    assert cost("star") == pytest.approx(2 * a + 2 * 8 * MIB * b + 8 * MIB * g)


def test_eight_ranks_on_two_nodes_by_hand() -> None:
    params = Params(
        intra=Link(1 * US, 0.1 * NS), inter=Link(10 * US, 1 * NS), gamma_s_per_byte=0.5 * NS
    )
    ai, ae, b, g = 1 * US, 10 * US, 1 * NS, 0.5 * NS
    s, seg = 8 * MIB, 1 * MIB
    two_nodes, one_node = Shape(8, 4), Shape(8, 8)
    assert two_nodes.nodes == 2 and one_node.nodes == 1
    # Ring (ranks 0-3 and 4-7): 2(N-1) = 14 steps of a 1 MiB chunk, 7 of them summing. A chunk's
    # chain of 14 hops crosses each of the two node boundaries twice: 4 slow hops, 10 fast.
    ring = 10 * ai + 4 * ae + 14 * 1 * MIB * b + 7 * 1 * MIB * g
    # Tree 0 -> 4 -> {2 -> {1, 3}, 6 -> {5, 7}}: height 3, 8 segments, 8 - 1 + 2 * 3 = 13 rounds.
    # Its deepest path 0 -> 4 -> 2 -> 1 crosses twice (0 -> 4, 4 -> 2) each way; the 7 further
    # rounds of the pipeline go at the slow link. An interior rank sends 3 segments a round (up
    # one, down two) and sums 2.
    tree = 2 * ai + 4 * ae + 7 * ae + 13 * 3 * MIB * b + 10 * 2 * MIB * g
    # Two trees of 4 MiB: 4 segments, 4 - 1 + 6 = 9 rounds, the mirror tree crossing twice too.
    # The busiest rank is interior in one tree (3 segments out) and a leaf in the other (1).
    two_tree = 2 * ai + 4 * ae + 3 * ae + 9 * 4 * MIB * b + 6 * 2 * MIB * g
    for name, expected in (("ring", ring), ("tree", tree), ("two_tree", two_tree)):
        assert predict(name, s, two_nodes, params, seg) == pytest.approx(expected), name
    # On one node every hop is a fast one.
    assert predict("ring", s, one_node, params, seg) == pytest.approx(
        14 * ai + 14 * 1 * MIB * 0.1 * NS + 7 * 1 * MIB * g
    )


@pytest.mark.parametrize("n", range(2, 13))
def test_the_rings_node_crossings_are_the_worst_chains(n: int) -> None:
    for per_node in range(1, n + 1):
        node = [r // per_node for r in range(n)]
        crosses = [node[r] != node[(r + 1) % n] for r in range(n)]  # hop r -> r + 1
        worst = max(sum(crosses[(a + i) % n] for i in range(2 * (n - 1))) for a in range(n))
        assert schedule("ring", 1 << 20, n, 1 << 20, per_node).inter_hops == worst, per_node


def _rounds_the_trees_run(name: str, n: int, numel: int, seg: int) -> tuple[int, int]:
    """Rounds of the schedule `run_trees` runs over every rank, and how many of them sum."""
    if name == "tree":
        plan = [(binary_tree(n), (0, numel))]
    else:
        plan = list(zip(double_binary_tree(n), split(0, numel, 2), strict=True))
    busy, summing = set(), set()
    for rank in range(n):
        for channel, (tree, span) in enumerate(plan):
            for i, (sends, recvs) in _tree_rounds(tree, rank, span, seg, channel).items():
                if sends or recvs:
                    busy.add(i)
                if any(r.reduce for r in recvs):
                    summing.add(i)
    assert busy == set(range(len(busy)))  # no idle round in between
    return len(busy), len(summing)


@pytest.mark.parametrize("name", ["tree", "two_tree"])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 12, 16])
@pytest.mark.parametrize("segments", [1, 3])
def test_tree_rounds_are_the_rounds_the_algorithm_runs(name: str, n: int, segments: int) -> None:
    seg_elems = 64
    numel = 2 * segments * seg_elems  # tree: 2 * segments segments; two_tree: segments each
    counted = schedule(name, numel * 4, n, seg_elems * 4)
    assert (counted.rounds, counted.reduce_rounds) == _rounds_the_trees_run(
        name, n, numel, seg_elems
    )


def test_one_rank_or_no_bytes_costs_nothing_and_bad_input_is_refused() -> None:
    params = Params(intra=Link(1.0, 1.0), inter=Link(1.0, 1.0))
    assert predict("ring", 1 << 20, Shape(1, 1), params) == 0.0
    assert predict("tree", 0, Shape(4, 4), params) == 0.0
    assert bytes_sent("star", 0, 1, 100) == 0.0
    with pytest.raises(ValueError, match=r"rank must be in \[0, 4\)"):
        bytes_sent("tree", 4, 4, 100)
    with pytest.raises(ValueError, match="no cost model for 'bogus'"):
        schedule("bogus", 1 << 20, 4, 1 << 20)
    with pytest.raises(ValueError, match="ranks"):
        Shape(0, 1)
    with pytest.raises(ValueError, match=">= 0"):
        Link(-1.0, 0.0)


def test_the_nccl_preset_holds_tuning_cc_s_numbers() -> None:
    from autotune.model import nccl_params

    ring = nccl_params("ring", "LL", multi_node=True, intra_gbps=50, inter_gbps=12.5)
    assert ring.base_s == pytest.approx(3.6 * US)
    assert ring.intra.alpha_s == pytest.approx(0.47 * 1.8 * US)  # LL across nodes: x1.8
    assert ring.inter.alpha_s == pytest.approx(2.7 * US)
    assert ring.inter.beta_s_per_byte == pytest.approx(1 / 12.5e9)
    tree = nccl_params("two_tree", "LL128", intra="pci", multi_node=False)
    assert (tree.base_s, tree.intra.alpha_s, tree.inter.alpha_s) == pytest.approx(
        (4.4 * US, 1.9 * US, 8.5 * US)
    )
    with pytest.raises(ValueError, match="protocol"):
        nccl_params("ring", "LL64")


def test_the_ring_at_summits_shape_matches_nccls_own_latency() -> None:
    from autotune.model import nccl_params

    # NCCL: baseLat + (nsteps - nInterSteps) intraLat + nInterSteps interLat, nsteps = 2(N-1),
    # nInterSteps = 2(nodes-1). The ring's chain here crosses each of the 4096 boundaries twice
    # (2 more network hops than NCCL counts); an 8 B message has no byte term worth the name.
    n, nodes = 24576, 4096
    nccl = 3.6 + (2 * (n - 1) - 2 * (nodes - 1)) * 0.47 * 1.8 + 2 * (nodes - 1) * 2.7
    ours = predict("ring", 8, Shape(n, 6), nccl_params("ring", "LL"), segment_bytes=8)
    expected = nccl + 2 * (2.7 - 0.47 * 1.8)  # the 2 hops that cross instead of staying
    assert ours * 1e6 == pytest.approx(expected, rel=1e-4)


def test_a_fit_to_times_the_model_made_recovers_its_prices() -> None:
    from autotune.model import Sample, fit

    truth = Params(
        intra=Link(30 * US, 0.25 * NS),
        inter=Link(30 * US, 0.25 * NS),
        gamma_s_per_byte=0.8 * NS,
        base_s=200 * US,
    )
    samples = [
        Sample(name, size, n, predict(name, size, Shape(n, n), truth, 1 << 20), 1 << 20)
        for name in ("ring", "tree", "two_tree", "direct", "star")
        for size in (1 << 10, 1 << 16, 1 << 20, 1 << 24)
        for n in (2, 4, 8)
    ]
    fitted = fit(samples)
    p = fitted.params
    assert (p.base_s, p.intra.alpha_s, p.intra.beta_s_per_byte, p.gamma_s_per_byte) == (
        pytest.approx((200 * US, 30 * US, 0.25 * NS, 0.8 * NS), rel=1e-6)
    )
    assert fitted.worst_error() < 1e-9 and fitted.median_error("ring") < 1e-9
    # Noise the prices cannot explain shows up as error, and no price goes negative.
    noisy = [
        Sample(s.algorithm, s.nbytes, s.ranks, s.seconds * (1.5 if i % 2 else 1.0), s.segment_bytes)
        for i, s in enumerate(samples)
    ]
    rough = fit(noisy)
    assert rough.worst_error() > 0.1
    q = rough.params
    assert min(q.base_s, q.intra.alpha_s, q.intra.beta_s_per_byte, q.gamma_s_per_byte) >= 0
    with pytest.raises(ValueError, match="at least 4"):
        fit(samples[:3])


def test_autotune_model_prints_a_table_per_world_size(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    argv = ["model", "--ranks", "8,24576", "--ranks-per-node", "6", "-b", "8", "-e", "8M"]
    assert main([*argv, "-f", "1024", "--algorithms", "ring,two_tree", "--wide"]) == 0
    out = capsys.readouterr().out
    assert "NCCL LL latencies" in out and "tuning.cc" in out
    tables = out.split("\n\n# ")[1:]  # each table opens after a blank line
    assert [t.split(",")[0] for t in tables] == ["8 ranks", "24576 ranks"]
    small = [line.split() for line in tables[1].splitlines() if line.strip().startswith("8 ")]
    assert small and small[0][-1] == "two_tree"  # latency wins at scale for tiny messages
    ring_us, tree_us = float(small[0][1]), float(small[0][3])
    assert ring_us / tree_us > 100
    assert main(["model", "--ranks", "1", "-b", "8", "-e", "8"]) == 0
    assert "1 rank: nothing to all-reduce" in capsys.readouterr().out
    assert main(["model", "--algorithms", "bogus"]) == 2
    assert "unknown algorithm 'bogus': no model for it" in capsys.readouterr().err
    # native with NCCL's prices: NCCL's own pick, its tree at Summit's shape for 8 bytes.
    assert main(["model", "--ranks", "24576", "--ranks-per-node", "6", "-b", "8", "-e", "8",
                 "--algorithms", "native,hierarchical_two_tree", "--wide"]) == 0  # fmt: skip
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert row[1] == row[3] == "133.8"


def test_the_prior_orders_by_prediction_and_leaves_out_only_what_cannot_win() -> None:
    from autotune.model import Prior
    from autotune.plan import Choice
    from autotune.tuning.space import search_space

    # Every round 10 ms, bytes free: fewer rounds is faster. At 2 ranks and 1 MiB, unsegmented
    # ring, tree and two_tree take 2 rounds; with 256 KiB segments two_tree 3, ring 4, tree 5.
    rounds_only = Params(Link(0.01, 0.0), Link(0.01, 0.0))
    space = search_space(1 << 20, ("native", "ring", "tree", "two_tree"))
    native = Choice("native")
    tight = Prior(rounds_only, worst_error=0.05)  # cut (1.05 / 0.95) = 1.105x the best
    assert tight.cut == pytest.approx(1.05 / 0.95)
    kept = tight.order(1 << 20, 2, space, keep=native)
    assert kept[0] == native  # the baseline first: measured, never predicted or left out
    assert set(kept[1:]) == {Choice("ring"), Choice("tree"), Choice("two_tree")}
    # The incumbent stays, however slow its prediction.
    slow = Choice("tree", 256 << 10)
    assert slow in tight.order(1 << 20, 2, space, keep=slow)
    # Asked for (prune=False), or with a fit too rough to bound anything, all stay, in order.
    everything = tight.order(1 << 20, 2, space, keep=native, prune=False)
    assert everything[-3:] == [Choice("two_tree", 256 << 10), Choice("ring", 256 << 10), slow]
    rough = Prior(rounds_only, worst_error=1.2)
    assert rough.cut == math.inf
    assert rough.order(1 << 20, 2, space, keep=native) == everything
    # Stored and read back as the sweep stores it.
    assert Prior.from_json(tight.to_json()) == tight
    with pytest.raises(ValueError, match="not a stored cost-model fit"):
        Prior.from_json({"alpha_s": 1.0})


def test_hierarchical_ring_on_two_nodes_by_hand() -> None:
    params = Params(
        intra=Link(1 * US, 0.1 * NS), inter=Link(10 * US, 1 * NS), gamma_s_per_byte=0.5 * NS
    )
    ai, ae, bi, be, g = 1 * US, 10 * US, 0.1 * NS, 1 * NS, 0.5 * NS
    # 8 MiB on 2 nodes of 4, 1 MiB segments: 4 shards of 2 MiB. Across: the owners' rings of 2
    # ranks, 2 steps of a 1 MiB chunk, both hops slow, one summing. Inside: a scatter and a gather
    # round per 1 MiB segment of a shard (2 each): an owner sends 3 segments a round (to its node's
    # 3 others in the gather) and sums 3 in the scatter, at the fast link.
    across = 2 * ae + 2 * 1 * MIB * be + 1 * MIB * g
    inside = 2 * ai + 2 * ai + 4 * 3 * MIB * bi + 2 * 3 * MIB * g
    got = predict("hierarchical_ring", 8 * MIB, Shape(8, 4), params, 1 * MIB)
    assert got == pytest.approx(across + inside)
    # On one node, and with one rank per node, it is the ring.
    for shape in (Shape(8, 8), Shape(8, 1)):
        assert predict("hierarchical_ring", 8 * MIB, shape, params, MIB) == pytest.approx(
            predict("ring", 8 * MIB, shape, params, MIB)
        )
    # hierarchical_two_tree on one node is two_tree.
    assert predict("hierarchical_two_tree", 8 * MIB, Shape(8, 8), params, MIB) == pytest.approx(
        predict("two_tree", 8 * MIB, Shape(8, 8), params, MIB)
    )


@pytest.mark.parametrize(("ranks", "per_node"), [(4, 2), (6, 3), (6, 2), (5, 2), (7, 3), (8, 4)])
def test_hierarchical_bytes_are_what_its_schedule_sends(ranks: int, per_node: int) -> None:
    from autotune.algorithms._hierarchical_ring import hierarchical_rounds
    from autotune.comm.topology import Topology

    topo = Topology(tuple(r // per_node for r in range(ranks)))
    numel = 5 * 7 * 8 * 9 * 4  # divisible by every shard and chunk count here
    for r in range(ranks):
        sent = sum(
            s.stop - s.start for sends, _ in hierarchical_rounds(topo, r, numel, 64) for s in sends
        )
        assert bytes_sent("hierarchical_ring", r, ranks, numel, per_node) == pytest.approx(sent), r


def test_native_on_gloo_is_gloos_ring_by_hand() -> None:
    # gloo: max(ceil(S / 1 MiB), 2N) segments, rounded up to a multiple of N; a chunk of
    # segments / N of them moves 2(N-1) steps.
    from autotune.model import GLOO_MAX_SEGMENT_BYTES

    assert GLOO_MAX_SEGMENT_BYTES == 1 << 20
    # 2 ranks, 8 MiB: 8 segments of 1 MiB, 4 a chunk: 2 x 1 x 4 = 8 rounds, 4 of them summing.
    big = schedule("native", 8 << 20, 2, 1)
    assert (big.rounds, big.round_bytes, big.reduce_rounds, big.chain_hops) == (8, 1 << 20, 4, 2)
    # 4 ranks, 1 KiB: at least 2 segments a chunk (8 of 128 B): 2 x 3 x 2 = 12 rounds.
    small = schedule("native", 1 << 10, 4, 1)
    assert (small.rounds, small.round_bytes, small.reduce_rounds) == (12, 128, 6)
    # 3 ranks, 7 MiB: 7 segments round up to 9 (3 a chunk of 7/3 MiB).
    odd = schedule("native", 7 << 20, 3, 1)
    assert odd.rounds == 2 * 2 * 3 and odd.round_bytes == pytest.approx((7 << 20) / 9, abs=1)
    assert bytes_sent("native", 1, 4, 1 << 20) == 2 * 3 * (1 << 20) / 4


def test_nccl_native_is_the_faster_of_its_ring_and_its_tree() -> None:
    from autotune.model import nccl_native, nccl_params

    # The trees take NCCL's tree row, the hierarchical one too.
    assert nccl_params("hierarchical_two_tree", "LL") == nccl_params("tree", "LL")
    # Summit, 8 B: NCCL's tree formula, baseLat + 2((L-1) intraLat x1.8 + log2(nodes) interLat).
    t, pick = nccl_native(8, Shape(24576, 6), "LL")
    assert pick == "tree"
    # (The model adds 0.05 us for the bytes, which the formula leaves out.)
    assert t * 1e6 == pytest.approx(4.4 + 2 * (5 * 0.52 * 1.8 + 12 * 5.0), abs=0.06)
    # 8 ranks on one node, 256 MiB: bandwidth decides, and the ring's 2(N-1)/N beats the
    # trees' 2 (each tree's inner ranks send its half up and twice down).
    t, pick = nccl_native(256 << 20, Shape(8, 8), "Simple")
    ring = predict("ring", 256 << 20, Shape(8, 8), nccl_params("ring", "Simple", multi_node=False))
    assert pick == "ring" and t == ring


TWO_LINKS = Params(
    intra=Link(20 * US, 0.1 * NS),
    inter=Link(150 * US, 8.0 * NS),
    gamma_s_per_byte=0.5 * NS,
    base_s=100 * US,
)


def test_a_fit_across_nodes_recovers_both_links_prices() -> None:
    from autotune.model import Sample, fit

    shapes = [(4, 2), (4, 1), (6, 3), (4, 4), (2, 2)]  # (ranks, ranks per node)
    samples = [
        Sample(name, size, n, predict(name, size, Shape(n, k), TWO_LINKS, 1 << 20), 1 << 20, k)
        for name in ("native", "ring", "tree", "hierarchical_ring", "hierarchical_two_tree")
        for size in (1 << 10, 1 << 16, 1 << 20, 1 << 24)
        for n, k in shapes
    ]
    p = fit(samples).params
    got = (
        p.base_s, p.intra.alpha_s, p.intra.beta_s_per_byte, p.inter.alpha_s,
        p.inter.beta_s_per_byte, p.gamma_s_per_byte,
    )  # fmt: skip
    assert got == pytest.approx((100 * US, 20 * US, 0.1 * NS, 150 * US, 8 * NS, 0.5 * NS), rel=1e-6)
    # On one node only, one link stands for both.
    one = fit([s for s in samples if s.ranks_per_node == s.ranks]).params
    assert one.inter == one.intra and one.intra.alpha_s == pytest.approx(20 * US, rel=1e-6)


def test_a_sweep_across_nodes_gives_samples_on_its_nodes_and_natives_only_on_gloo() -> None:
    from autotune.sweep import Row, SweepResult, samples_from_sweep

    def row(algorithm: str) -> Row:
        return Row(1 << 20, 1 << 18, "float", algorithm, None, 1000.0, 1.0, 1.0, 0)

    def result(backend: str, node_of: list[int] | None) -> SweepResult:
        return SweepResult(
            4, backend, "cpu", "float", "", "", {},
            rows=[row("native"), row("ring"), row("tuned")], node_of=node_of,
        )  # fmt: skip

    across = samples_from_sweep(result("gloo", [0, 0, 1, 1]))
    assert [(s.algorithm, s.ranks, s.ranks_per_node) for s in across] == [
        ("native", 4, 2),
        ("ring", 4, 2),
    ]
    assert across[0].shape.nodes == 2 and across[0].seconds == pytest.approx(1e-3)
    assert [s.ranks_per_node for s in samples_from_sweep(result("gloo", [0, 0, 0, 0]))] == [
        None,
        None,
    ]
    assert [s.algorithm for s in samples_from_sweep(result("nccl", None))] == ["ring"]


def test_the_prior_orders_a_job_on_nodes_by_its_own_shape() -> None:
    from autotune.model import Prior
    from autotune.plan import Choice

    # A slow link between nodes: on 2 nodes x 4, the hierarchical ring, which puts 1/4 of the
    # flat ring's bytes on it, is predicted faster; on one node of 8 they are the same schedule.
    prior = Prior(TWO_LINKS, worst_error=0.8)  # cut: 1.8 / 0.2 = 9x the best
    space = [Choice("native"), Choice("ring"), Choice("hierarchical_ring"), Choice("star")]
    across = prior.order(64 << 20, 8, space, keep=Choice("native"), ranks_per_node=4)
    assert across[0] == Choice("native")
    assert across[1:3] == [Choice("hierarchical_ring"), Choice("ring")]
    assert Choice("star") not in across  # 44x the hierarchical ring; the ring is 5.6x
    flat = prior.order(64 << 20, 8, space, keep=Choice("native"))
    assert predict("ring", 64 << 20, Shape(8, 8), TWO_LINKS) == predict(
        "hierarchical_ring", 64 << 20, Shape(8, 8), TWO_LINKS
    )
    assert set(flat[1:3]) == {Choice("ring"), Choice("hierarchical_ring")}
    # Both links are stored; a record from before (one link) reads back with one link.
    assert Prior.from_json(prior.to_json()) == prior
    old = {k: v for k, v in prior.to_json().items() if not k.startswith("inter_")}
    assert Prior.from_json(old).params.inter == TWO_LINKS.intra


def test_autotune_model_fits_a_100_column_terminal_unless_asked_wide(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.cli import main

    monkeypatch.setenv("COLUMNS", "100")
    assert main(["model", "--ranks", "8,1024", "-e", "64K"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100
    assert "(table 1 of 4)" in out and "(table 4 of 4)" in out
    # Every table names the fastest of all eight, not of its own two: the same in each.
    fastest: dict[str, set[str]] = {}
    for line in out.split("\n\n# 1024 ranks")[0].splitlines():
        if line.startswith("  "):
            fastest.setdefault(line.split()[0], set()).add(line.split()[-1])
    assert fastest and all(len(names) == 1 for names in fastest.values()), fastest
    assert main(["model", "--ranks", "1024", "-e", "64K", "--wide"]) == 0
    wide = capsys.readouterr().out
    assert max(map(len, wide.splitlines())) > 200 and "(table" not in wide


def test_direct_is_priced_as_its_n_minus_1_messages_at_every_scale() -> None:
    params = Params(intra=Link(10 * US, 0.0), inter=Link(10 * US, 0.0), gamma_s_per_byte=0.0)
    for n in (2, 8, 1024):
        direct = predict("direct", 8, Shape(n, n), params, segment_bytes=1 << 20)
        assert direct == pytest.approx((n - 1) * 10 * US)  # n - 1 messages, latency each


def test_autotune_model_never_names_fastest_what_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It named direct fastest for small messages on a machine without autotune-baselines.
    import autotune.cli.model
    from autotune.algorithms import available
    from autotune.cli import main

    argv = ["model", "--ranks", "8", "-b", "8", "-e", "8", "--algorithms", "ring,direct", "--wide"]
    assert main(argv) == 0
    installed = capsys.readouterr().out.strip().splitlines()
    assert "direct" in available() and installed[-1].split()[-1] == "direct"  # it is fastest
    monkeypatch.setattr(
        autotune.cli.model, "available", lambda: [a for a in available() if a != "direct"]
    )
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "direct* time(us)" in lines[-3], lines
    assert lines[-2].split()[-1] == "ring"
    assert lines[-1].startswith("# * direct: modelled, not registered here"), lines[-1]
