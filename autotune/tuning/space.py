"""What is tuned for a message-size class, and how a choice is written in an Optuna trial.

One definition for the live tuner and for ``autotune sweep --tune``: both write studies with the
same parameters ("algorithm", "segment_bytes" where an algorithm has several, and "wire" where
the job allows compression), so a plan from one reads like a plan from the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.algorithms import ALGORITHMS
from autotune.plan import Choice

if TYPE_CHECKING:
    import optuna

    from autotune.comm.topology import Topology

__all__ = [
    "NO_WIRE",
    "SEGMENT_OPTIONS",
    "choice_of",
    "params_of",
    "search_space",
    "space_tag",
    "suggest_choice",
    "wires_of",
]

#: Segment sizes searched for a segmented algorithm, those below the message's size class.
SEGMENT_OPTIONS = (256 << 10, 1 << 20, 4 << 20)
#: The "wire" parameter of an uncompressed choice, in a study whose space has compressed ones.
NO_WIRE = "none"


def search_space(
    cls: int,
    candidates: Sequence[str],
    topology: Topology | None = None,
    wires: Sequence[str] = (),
) -> list[Choice]:
    """What is tried for a size class: each candidate, at each segment size below the class.

    A segmented algorithm is also tried unsegmented (its default) where its default segment
    holds the whole class, so pipelining has to earn its place. A topology-aware algorithm is
    left out where ``topology`` (None: one node) gives it nothing to use and its flat schedule
    (`AllReduceAlgorithm.flat_twin`) is a candidate itself: it would run that very schedule.
    Each is also tried on each of ``wires`` (`Choice.wire`: ``Config.compression``), after all
    of them uncompressed.
    """
    flat = topology is None or topology.nodes in (1, topology.size)
    space = []
    for name in candidates:
        algo = ALGORITHMS[name]
        if flat and algo.flat_twin in candidates:
            continue
        segments: list[int | None] = [s for s in SEGMENT_OPTIONS if s < cls]
        if not algo.segmented:
            segments = [None]
        elif cls <= algo.default_segment_bytes:
            segments.append(None)
        space += [Choice(name, s) for s in segments]
    return space + [Choice(c.algorithm, c.segment_bytes, w) for w in wires for c in space]


def suggest_choice(trial: optuna.Trial, space: Sequence[Choice]) -> Choice:
    """Ask ``trial`` for a choice in ``space``: an algorithm, then its segment if it has several,
    then its wire dtype where ``space`` has compressed choices."""
    names = sorted({c.algorithm for c in space})
    algorithm = trial.suggest_categorical("algorithm", names)
    # In the space's order, each once: a study's choices must stay as they were first written.
    segments = list(dict.fromkeys(c.segment_bytes for c in space if c.algorithm == algorithm))
    segment = segments[0]
    if len(segments) > 1:
        # 0 stands for None (the algorithm's default): Optuna's choices are plain values.
        segment = trial.suggest_categorical("segment_bytes", [s or 0 for s in segments]) or None
    wires = wires_of(space)
    if not wires:
        return Choice(algorithm, segment)
    wire = trial.suggest_categorical("wire", [NO_WIRE, *wires])
    return Choice(algorithm, segment, None if wire == NO_WIRE else wire)


def wires_of(space: Sequence[Choice]) -> list[str]:
    """The wire dtypes ``space`` offers, in its order."""
    return list(dict.fromkeys(c.wire for c in space if c.wire is not None))


def space_tag(space: Sequence[Choice]) -> str:
    """A short name for the algorithms ``space`` holds, for the name of a study written over it.

    Optuna refuses a parameter whose choices change within a study ("CategoricalDistribution does
    not support dynamic value space"), and `suggest_choice` offers the space's algorithms: jobs
    whose candidates differ (``Config.algorithms``, a plugin installed or not) each screen in a
    study of their own, and jobs with the same candidates share one."""
    names = ",".join(sorted({c.algorithm for c in space}))
    wires = wires_of(space)
    if wires:  # a space without compression keeps the name it always had
        names += "|wire=" + ",".join(wires)
    return hashlib.sha1(names.encode(), usedforsecurity=False).hexdigest()[:8]


def params_of(choice: Choice, wired: bool = False) -> dict[str, Any]:
    """The trial parameters `suggest_choice` records for ``choice`` (the inverse of `choice_of`);
    ``wired``: in a space with compressed choices, where every trial records its wire."""
    params: dict[str, Any] = {
        "algorithm": choice.algorithm,
        "segment_bytes": choice.segment_bytes or 0,
    }
    if wired:
        params["wire"] = choice.wire or NO_WIRE
    return params


def choice_of(params: Mapping[str, Any], space: Sequence[Choice]) -> Choice | None:
    """The choice a trial's parameters stand for (None: not in ``space``)."""
    wire = params.get("wire")
    choice = Choice(
        str(params.get("algorithm")),
        params.get("segment_bytes") or None,
        None if wire in (None, NO_WIRE) else str(wire),
    )
    if choice in space:
        return choice
    if "segment_bytes" not in params:
        # An algorithm with one option in this space records no segment_bytes.
        matches = [c for c in space if (c.algorithm, c.wire) == (choice.algorithm, choice.wire)]
        return matches[0] if len(matches) == 1 else None
    return None
