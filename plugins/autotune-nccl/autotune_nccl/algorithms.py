"""NCCL's own algorithm x protocol as autotune algorithms, named ``nccl.<algorithm>.<protocol>``.

Each runs the backend's all-reduce, as `native` does, with its combination armed in the plugin
for that one call (`Tuner.arm`): the tuner then searches NCCL's choices per size class beside
the point-to-point schedules. They join "auto" by themselves (`joins_auto`) where they are
`offered`: on NCCL, with this plugin the one NCCL loaded, for the combinations NCCL marks usable
on the group (`usable`, learnt from one all-reduce). Elsewhere (gloo, or another tuner plugin)
nothing would steer NCCL, so they are not offered.

This module needs autotune and torch; autotune loads it through the ``autotune.algorithms``
entry points of this distribution.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Mapping
from typing import ClassVar

import torch
from torch.distributed import ProcessGroup

from autotune.algorithms import Comm, NativeAllReduce, Pending, backend_for
from autotune.plan import Choice, Entry, Table
from autotune.util.units import format_bytes
from autotune_nccl import ALGORITHMS, PROTOCOLS, Tuner

__all__ = ["COMBINATIONS", "NcclAllReduce", "combination", "usable"]

_log = logging.getLogger("autotune")

#: Elements of the all-reduce that asks NCCL which combinations it offers (1 MiB in float32).
PROBE_ELEMENTS = 1 << 18

_controls: list[Tuner] = []
_usable: dict[tuple[str, str], frozenset[tuple[str, str]]] = {}
_lock = threading.Lock()


def controls() -> Tuner:
    """The plugin's controls in this process (one library, opened once)."""
    with _lock:
        if not _controls:
            _controls.append(Tuner())
        return _controls[0]


class NcclAllReduce(NativeAllReduce):
    """NCCL's all-reduce with one algorithm x protocol forced for the call; channels, chunk size
    and everything else stay NCCL's. Subclasses name the combination (`combination`)."""

    runs_on = ("nccl/cuda",)  # and NCCL must load the tuner plugin (NCCL_TUNER_PLUGIN)
    needs = (
        "NCCL to load autotune-nccl's tuner plugin (NCCL_TUNER_PLUGIN), two or more ranks, and "
        "NCCL to offer this algorithm and protocol there"
    )
    nccl_algorithm: ClassVar[str]
    nccl_protocol: ClassVar[str]
    joins_auto = True
    #: Once autotune unhooks, NCCL runs the cells from the plugin's table (`carry`).
    carrier = "autotune-nccl"

    @classmethod
    def carry(cls, classes: Mapping[int, Choice], ranks: int) -> str:
        """Load ``classes`` (size class -> a cell) into the plugin's table, as ``autotune show
        --nccl-csv`` writes them (rows for all-reduces of ``ranks`` ranks, each class's size
        range): from now on NCCL runs each all-reduce of those sizes on its cell without the
        hook. The table replaces any other; a call still armed (`Tuner.arm`) comes first."""
        entries = {c: Entry(choice, state="locked") for c, choice in classes.items()}
        csv = Table(entries).nccl_csv(-1, ranks)
        with tempfile.TemporaryDirectory(prefix="autotune-nccl-") as tmp:
            path = os.path.join(tmp, "table.csv")
            with open(path, "w") as f:
                f.write(csv)
            rows = controls().load_table(path)
        cells = ", ".join(f"{format_bytes(c)}: {ch.algorithm}" for c, ch in sorted(classes.items()))
        _log.info("autotune: NCCL's tuner plugin runs the tuned cells from a table: %s", cells)
        return f"NCCL's tuner plugin runs {rows} row(s) of tuned cells: {cells}"

    def __init__(self, *, timeout_s: float | None = None) -> None:
        super().__init__(timeout_s=timeout_s)
        self.refused = 0  # calls NCCL answered with its own choice (the cell was unusable)

    def _start(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> Pending:
        tuner = controls()
        tuner.arm(self.nccl_algorithm, self.nccl_protocol)
        try:
            pending = self._launch(buf, comm)
        finally:
            # The first all-reduce NCCL asks about on this thread takes the choice; still armed:
            # nothing asked the plugin (not NCCL, or NCCL without it).
            asked = not tuner.armed
            if not asked:
                tuner.disarm()
        report = tuner.last() if asked else None
        if report is not None and report.refused:
            self.refused += 1
            if self.refused == 1:
                _log.warning(
                    "autotune: NCCL marked %s unusable for a %d-byte all-reduce and ran its own "
                    "choice instead",
                    self.name,
                    report.nbytes,
                )
        return pending

    def _launch(self, buf: torch.Tensor, comm: Comm) -> Pending:
        """The backend's all-reduce, as `native` launches it (NCCL asks its tuner plugin on the
        thread that launches the collective, so the armed choice is this call's)."""
        return NativeAllReduce._start(self, buf, comm, 1)

    @classmethod
    def consults(cls, backend: str) -> bool:
        """Whether ``backend`` asks a tuner plugin: NCCL's does."""
        return backend == "nccl"

    @classmethod
    def offered(cls, group: ProcessGroup, device: torch.device) -> bool:
        return (cls.nccl_algorithm, cls.nccl_protocol) in usable(cls, group, device)


def usable(
    cls: type[NcclAllReduce], group: ProcessGroup, device: torch.device
) -> frozenset[tuple[str, str]]:
    """The (algorithm, protocol) combinations NCCL offers for an all-reduce on the dedicated
    group ``cls`` runs on for ``group``, learnt once per group and device from one unsteered
    all-reduce; empty where NCCL does not ask this plugin. Every rank calls it in the same order
    (`autotune.algorithms.agreed` does)."""
    if not cls.consults(backend_for(group, device)):
        return frozenset()
    algo = cls()
    comm = algo.connect(group, device)
    key = (comm.group.group_name, str(device))
    with _lock:
        known = _usable.get(key)
    if known is not None:
        return known
    tuner = controls()
    calls = tuner.last().calls
    algo._launch(torch.zeros(PROBE_ELEMENTS, device=device), comm).wait()
    report = tuner.last()
    if report.calls == calls:
        _log.warning(
            "autotune: NCCL did not ask autotune's tuner plugin, so NCCL's own algorithms are "
            "not tuned; set NCCL_TUNER_PLUGIN=%s before the first NCCL communicator "
            "(docs/NCCL_TUNER.md)",
            tuner.path,
        )
        found: frozenset[tuple[str, str]] = frozenset()
    else:
        found = report.usable
    with _lock:
        _usable[key] = found
    return found


def combination(algorithm: str, protocol: str) -> type[NcclAllReduce]:
    """The algorithm class ``nccl.<algorithm>.<protocol>``."""
    name = f"nccl.{algorithm}.{protocol.lower()}"
    return type(
        f"Nccl_{algorithm}_{protocol}",
        (NcclAllReduce,),
        {
            "name": name,
            "nccl_algorithm": algorithm,
            "nccl_protocol": protocol,
            "__doc__": f"NCCL's all-reduce forced to {algorithm} with the {protocol} protocol.",
            "__module__": __name__,
        },
    )


#: Every cell of NCCL's cost table as an algorithm, by autotune name. Which ones NCCL runs an
#: all-reduce with depends on its version and the machine (PAT serves all-gather and
#: reduce-scatter only; NVLS needs NVSwitch, CollNet a SHARP network): `usable` asks it.
COMBINATIONS: dict[str, type[NcclAllReduce]] = {
    cls.name: cls for cls in (combination(a, p) for a in ALGORITHMS for p in PROTOCOLS)
}

# Each class is also a module attribute (Nccl_ring_LL128, ...), so an entry point
# ("module:attribute") can name it.
globals().update({cls.__name__: cls for cls in COMBINATIONS.values()})
