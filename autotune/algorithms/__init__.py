"""Swappable all-reduce algorithms on torch.distributed point-to-point operations; their registry.

Built in: ``ring``, ``tree``, ``two_tree``, ``hierarchical_ring``, ``hierarchical_two_tree``,
``native``, and ``shm`` (ranks on one host: through shared memory, with the group only to say
when); more arrive through `register` or the ``autotune.algorithms`` entry-point group (the
``direct`` and ``star`` baselines ship that way).
"""

from __future__ import annotations

from autotune.algorithms._base import (
    SUPPORTED_DTYPES,
    AllReduceAlgorithm,
    Pending,
    at_storage_start,
    check_tensor,
)
from autotune.algorithms._choice import (
    COMPRESSIBLE,
    WIRES,
    Choice,
    split_label,
    wire_dtype,
    wire_of,
)
from autotune.algorithms._hierarchical_ring import HierarchicalRingAllReduce
from autotune.algorithms._hierarchical_two_tree import HierarchicalTwoTreeAllReduce
from autotune.algorithms._native import NativeAllReduce
from autotune.algorithms._offered import agreed
from autotune.algorithms._registry import (
    ALGORITHMS,
    ENTRY_POINT_GROUP,
    PLUGIN_SOURCES,
    available,
    carried,
    carry,
    get_algorithm,
    get_algorithm_class,
    load_plugins,
    register,
)
from autotune.algorithms._ring import RingAllReduce
from autotune.algorithms._shared_memory import SharedMemoryAllReduce
from autotune.algorithms._transport import (
    Recv,
    Round,
    ScratchPool,
    Send,
    Transport,
    segments,
    split,
)
from autotune.algorithms._tree import TreeAllReduce
from autotune.algorithms._trees import (
    Tree,
    binary_tree,
    double_binary_tree,
    node_double_binary_tree,
    render,
)
from autotune.algorithms._two_tree import TwoTreeAllReduce
from autotune.comm.groups import (
    Comm,
    PeerError,
    Traffic,
    backend_for,
    bookkeeping_device,
    connect,
    current_device,
    ensure_ready,
    forget_p2p_group,
    p2p_group,
    sibling_group,
)

__all__ = [
    "ALGORITHMS",
    "BUILTINS",
    "COMPRESSIBLE",
    "ENTRY_POINT_GROUP",
    "PLUGIN_SOURCES",
    "SUPPORTED_DTYPES",
    "WIRES",
    "AllReduceAlgorithm",
    "Choice",
    "Comm",
    "HierarchicalRingAllReduce",
    "HierarchicalTwoTreeAllReduce",
    "NativeAllReduce",
    "PeerError",
    "Pending",
    "Recv",
    "RingAllReduce",
    "Round",
    "ScratchPool",
    "Send",
    "SharedMemoryAllReduce",
    "Traffic",
    "Transport",
    "Tree",
    "TreeAllReduce",
    "TwoTreeAllReduce",
    "agreed",
    "at_storage_start",
    "available",
    "backend_for",
    "binary_tree",
    "bookkeeping_device",
    "carried",
    "carry",
    "check_tensor",
    "connect",
    "current_device",
    "double_binary_tree",
    "ensure_ready",
    "forget_p2p_group",
    "get_algorithm",
    "get_algorithm_class",
    "load_plugins",
    "node_double_binary_tree",
    "p2p_group",
    "register",
    "render",
    "segments",
    "sibling_group",
    "split",
    "split_label",
    "wire_dtype",
    "wire_of",
]

#: The algorithms that ship with autotune itself.
BUILTINS: tuple[type[AllReduceAlgorithm], ...] = (
    NativeAllReduce,
    RingAllReduce,
    TreeAllReduce,
    TwoTreeAllReduce,
    HierarchicalRingAllReduce,
    HierarchicalTwoTreeAllReduce,
    SharedMemoryAllReduce,
)
for _cls in BUILTINS:
    register(_cls.name, _cls)
del _cls
