"""A tuned table as the NCCL example tuner plugin's CSV (``NCCL_TUNER_CONFIG_FILE``), which
autotune's NCCL plugin reads too (``AUTOTUNE_NCCL_TABLE``): `autotune show --nccl-csv`.
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.algorithms import Choice

__all__ = ["nccl_csv"]


def nccl_csv(choices: Mapping[int, Choice], n_nodes: int = -1, n_ranks: int = -1) -> str:
    """A table's choices (size class -> choice) as the NCCL example tuner plugin's CSV
    (``NCCL_TUNER_CONFIG_FILE``), which autotune's plugin reads too (``AUTOTUNE_NCCL_TABLE``).

    A tuned NCCL cell, ``nccl.<algorithm>.<protocol>`` (autotune-nccl), is written as it is.
    Otherwise: ring -> NCCL ring; tree and two_tree -> NCCL tree (NCCL's tree is the double
    binary tree), with a protocol autotune did not tune: ``ll`` up to 64 KiB, ``simple``
    above (NCCL's usual split for latency- and bandwidth-bound sizes). Classes whose choice
    has no NCCL counterpart (native, direct, star, plugins) are left to NCCL and listed in a
    comment. Channels are left to NCCL (-1).
    """
    nccl_names = {"ring": "ring", "tree": "tree", "two_tree": "tree"}
    lines = [
        "# NCCL tuner configuration exported by autotune (autotune show --nccl-csv)",
        "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,"
        "numPipeOps,regBuff",
        "# protocol where autotune did not tune it (not nccl.*): ll to 64 KiB, simple above",
    ]
    skipped: list[str] = []
    for size, choice in sorted(choices.items()):
        low = 0 if size == 1 else size // 2 + 1
        kind, _, cell = choice.algorithm.partition(".")
        algo: str | None
        if kind == "nccl" and cell.count(".") == 1:
            algo, proto = cell.split(".")
        else:
            algo = nccl_names.get(choice.algorithm)
            proto = "ll" if size <= 64 << 10 else "simple"
        if algo is None:
            skipped.append(f"{low}-{size}: {choice.algorithm}")
            continue
        lines.append(f"allreduce,{low},{size},{algo},{proto},-1,{n_nodes},{n_ranks},-1,-1")
    if skipped:
        lines.append("# left to NCCL (no NCCL counterpart): " + "; ".join(skipped))
    return "\n".join(lines) + "\n"
