"""NCCL's own tuning constants as a preset for the model.

From NVIDIA/nccl ``src/graph/tuning.cc`` (``baseLat`` and ``hwLat``, microseconds), as read at
commit 01afd20a77b5804e0ecf1042509dd9d20ebf9e93 (the NCCL 2.8 era, copyright 2016-2020). Later
releases add algorithms (CollNet, NVLS, PAT) and retune some values. NCCL prices an all-reduce
as ``baseLat`` plus a hop latency per step: on its ring ``2(N-1)`` steps, ``2(nodes-1)`` of them
over the network; on its tree ``2(ranks per node - 1)`` hops inside nodes and ``2 log2(nodes)``
over the network. The model sums the same hop latencies along each algorithm's own chain.

NCCL takes its bandwidths from the topology it detects (channels x link speed), not from
constants, so the preset takes the links' speeds as arguments.
"""

from __future__ import annotations

from typing import Any

from autotune.model._cost import Link, Params, Shape, predict

__all__ = ["NCCL_SOURCE", "PROTOCOLS", "nccl_native", "nccl_params"]

NCCL_SOURCE = "NVIDIA/nccl src/graph/tuning.cc @ 01afd20a (baseLat, hwLat)"
PROTOCOLS = ("LL", "LL128", "Simple")

# (algorithm, protocol) -> microseconds, as in tuning.cc.
_BASE_LAT_US = {
    ("tree", "LL"): 4.4,
    ("tree", "LL128"): 4.4,
    ("tree", "Simple"): 0.0,
    ("ring", "LL"): 3.6,
    ("ring", "LL128"): 10.0,
    ("ring", "Simple"): 8.4,
}
_HW_LAT_US = {
    "nvlink": {
        ("tree", "LL"): 0.52,
        ("tree", "LL128"): 1.2,
        ("tree", "Simple"): 28.0,
        ("ring", "LL"): 0.47,
        ("ring", "LL128"): 1.9,
        ("ring", "Simple"): 3.4,
    },
    "pci": {
        ("tree", "LL"): 1.0,
        ("tree", "LL128"): 1.9,
        ("tree", "Simple"): 28.0,
        ("ring", "LL"): 1.0,
        ("ring", "LL128"): 2.5,
        ("ring", "Simple"): 5.7,
    },
    "net": {
        ("tree", "LL"): 5.0,
        ("tree", "LL128"): 8.5,
        ("tree", "Simple"): 50.0,
        ("ring", "LL"): 2.7,
        ("ring", "LL128"): 4.0,
        ("ring", "Simple"): 9.6,
    },
}
_TREES = ("tree", "two_tree", "hierarchical_two_tree")
#: tuning.cc: "if (comm->nNodes > 1 && p == NCCL_PROTO_LL) intraLat *= 1.8".
_LL_MULTI_NODE_INTRA = 1.8


def nccl_params(
    algorithm: str,
    protocol: str = "LL",
    *,
    intra: str = "nvlink",
    multi_node: bool = True,
    intra_gbps: float = 50.0,
    inter_gbps: float = 12.5,
) -> Params:
    """Prices for ``algorithm`` with NCCL's latencies for ``protocol``.

    The trees (``tree``, ``two_tree``, ``hierarchical_two_tree``) take NCCL's tree row (NCCL's
    tree is the double binary tree since 2.4, with chains inside nodes); the rings and the
    baselines, which NCCL does not have, its ring row.
    ``intra`` is the link inside a node ("nvlink" or "pci"); ``intra_gbps`` and ``inter_gbps``
    (GB/s per rank) are assumptions the caller owns: they only matter for large messages.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"NCCL protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if intra not in ("nvlink", "pci"):
        raise ValueError(f"intra must be 'nvlink' or 'pci', got {intra!r}")
    if not (intra_gbps > 0 and inter_gbps > 0):
        raise ValueError(f"link speeds must be > 0 GB/s, got {intra_gbps}, {inter_gbps}")
    row = "tree" if algorithm in _TREES else "ring"
    scale = _LL_MULTI_NODE_INTRA if multi_node and protocol == "LL" else 1.0
    us = 1e-6
    return Params(
        intra=Link(_HW_LAT_US[intra][row, protocol] * scale * us, 1 / (intra_gbps * 1e9)),
        inter=Link(_HW_LAT_US["net"][row, protocol] * us, 1 / (inter_gbps * 1e9)),
        gamma_s_per_byte=0.0,  # sums run inside the copy kernels
        base_s=_BASE_LAT_US[row, protocol] * us,
    )


def nccl_native(
    nbytes: int,
    shape: Shape,
    protocol: str = "LL",
    segment_bytes: int | None = None,
    **links: Any,
) -> tuple[float, str]:
    """NCCL's own all-reduce as its tuning model picks it: the faster of its ring (the ring's
    schedule on the ring row) and its tree (``hierarchical_two_tree``'s schedule, chains inside
    nodes and a double binary tree across them, on the tree row), for one ``protocol``.
    Returns the time and which NCCL picks ("ring" or "tree"). ``links``: `nccl_params`' own."""
    multi = shape.nodes > 1
    ring = predict(
        "ring", nbytes, shape, nccl_params("ring", protocol, multi_node=multi, **links),
        segment_bytes,
    )  # fmt: skip
    tree = predict(
        "hierarchical_two_tree", nbytes, shape,
        nccl_params("tree", protocol, multi_node=multi, **links), segment_bytes,
    )  # fmt: skip
    return (ring, "ring") if ring <= tree else (tree, "tree")
