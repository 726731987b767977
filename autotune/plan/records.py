"""The parts of a tuned table (`autotune.plan.table`): per size class an `Entry` (the choice, its
screening, its state), the measured `Gain`, a near miss (`NearMiss`) and DDP's `Buckets`, each to
and from JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.plan.runtime import (
    Arm,
    Choice,
    check_fusion_bytes,
    check_segment_bytes,
    size_class,
)
from autotune.util.names import unknown
from autotune.util.units import count

__all__ = [
    "LEAD_KINDS",
    "STATES",
    "Buckets",
    "Entry",
    "Gain",
    "NearMiss",
    "choice_json",
    "read_choice",
    "read_class",
]


#: What a size class's entry in a tuned table can say about it.
STATES = ("default", "exploring", "locked", "fixed")


@dataclass(frozen=True)
class Entry:
    """One size class of a tuned table: its choice and what the tuner learned about it."""

    choice: Choice
    best_s: float | None = None  # the choice's screening latency when it was locked
    trials: int = 0
    state: str = "default"  # "default", "exploring" or "locked"


@dataclass(frozen=True)
class Gain:
    """A plan's training step over the baseline's (the backend's own all-reduce on DDP's
    buckets), from paired iterations: the median ratio, its 95% interval, the pairs behind it.
    Below 1 the plan is faster; ``high`` is inf until the pairs can bound it."""

    ratio: float
    low: float
    high: float
    pairs: int

    def over(self, pairs_of: str = "") -> str:
        """``0.95x over 24 pairs`` (``pairs_of``: what is paired, where not iterations)."""
        return f"{self.ratio:.2f}x over {count(self.pairs, 'pair')}" + (
            f" of {pairs_of}" if pairs_of else ""
        )

    def interval(self) -> str:
        """``0.88-0.95x``, the 95% interval (``?`` for an upper end the pairs cannot bound yet)."""
        high = "?" if math.isinf(self.high) else f"{self.high:.2f}"
        return f"{self.low:.2f}-{high}x"

    def verdict(self, pairs_of: str, what: str) -> str:
        """The summary line of a job whose step this gain measures against plain DDP's."""
        return (
            f"autotune vs plain DDP: {self.ratio:.2f}x step time ({count(self.pairs, 'pair')} of "
            f"{pairs_of}, 95% interval {self.interval()}; {what})"
        )

    def to_json(self) -> dict[str, object]:
        finite = {
            k: v if math.isfinite(v) else None
            for k, v in (("low", self.low), ("high", self.high), ("ratio", self.ratio))
        }
        return {**finite, "pairs": self.pairs}

    @classmethod
    def from_json(cls, data: object) -> Gain:
        if not isinstance(data, dict):
            raise ValueError(f"gain: expected an object, got {data!r}")
        values = []
        for key, missing in (("ratio", math.nan), ("low", 0.0), ("high", math.inf)):
            v = data.get(key)
            if v is None:
                values.append(missing)
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"gain: {key} must be a number >= 0 or null, got {v!r}")
            else:
                values.append(float(v))
        pairs = data.get("pairs")
        if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 0:
            raise ValueError(f"gain: pairs must be an int >= 0, got {pairs!r}")
        return cls(values[0], values[1], values[2], pairs)


#: `NearMiss.kind`: how a plan came to lead, and why the next job tests it again, as
#: ``autotune show`` says it.
LEAD_KINDS = {
    "near": "ahead but not beyond noise",
    "beaten": "beat the baseline, then lost to a plan that lost the check against plain DDP",
    "checked": "ahead of plain DDP at the check, but not beyond noise",
}


@dataclass(frozen=True)
class NearMiss:
    """A plan for the next job with the same fingerprint to test against the baseline once more,
    when a job kept the baseline (`autotune.tuning.plan_search`). ``kind`` says why: ``"near"``,
    it was ahead of the baseline on the step but not beyond noise; ``"beaten"``, it beat the
    baseline, and lost only to a plan that then lost the check against plain DDP; ``"checked"``,
    it lost the check against plain DDP ahead on the median, not beyond noise. ``gain`` is what
    the first job measured: against the baseline in pairs of iterations, or for ``"checked"``,
    against plain DDP in pairs of blocks."""

    arm: Arm
    gain: Gain
    kind: str = "near"

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in LEAD_KINDS:
            kinds = ", ".join(LEAD_KINDS)
            raise ValueError(f"lead: kind must be one of {kinds}, got {self.kind!r}")

    def describe(self) -> str:
        """``fusion 16 MiB (0.95x over 24 pairs)``, as the verdict and ``autotune show`` say it."""
        blocks = "blocks" if self.kind == "checked" else ""
        return f"{self.arm.describe()} ({self.gain.over(blocks)})"

    def why(self) -> str:
        """Why the next job tests it again, as ``autotune show`` says it."""
        return LEAD_KINDS[self.kind]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "fusion_bytes": self.arm.fusion_bytes,
            "choices": {str(cls): choice_json(c) for cls, c in self.arm.choices},
            "gain": self.gain.to_json(),
        }
        if self.kind != "near":  # a lead stored before kinds has no such key
            out["kind"] = self.kind
        return out

    @classmethod
    def from_json(cls, data: object) -> NearMiss:
        from autotune.algorithms import available

        if not isinstance(data, dict) or not isinstance(data.get("choices"), dict):
            raise ValueError(f"lead: expected an object with a 'choices' object, got {data!r}")
        names = available()
        choices = {}
        for key, raw in data["choices"].items():
            where = f"lead, class {key!r}"
            choices[read_class(key, where)] = read_choice(raw, names, where)
        fusion = data.get("fusion_bytes")
        if fusion is None:
            raise ValueError("lead: fusion_bytes must be an int (bytes), got null")
        check_fusion_bytes(fusion, "lead: fusion_bytes")
        assert isinstance(fusion, int)
        kind = data.get("kind", "near")
        return cls(Arm.of(choices, fusion), Gain.from_json(data.get("gain")), kind)


@dataclass(frozen=True)
class Buckets:
    """DDP's own bucket size that a job kept once autotune unhooked
    (`autotune.tuning.buckets`), and its step over DDP's buckets as the job built them, plain DDP
    as the user set it up (None: that size is the job's own; no other beat it). Where the job's own
    was kept, ``lead`` is the size that came closest (ahead on the step, not beyond noise) with
    what it measured: the next job tests it once more."""

    bucket_bytes: int
    gain: Gain | None
    lead: Buckets | None = None

    def __post_init__(self) -> None:
        if self.lead is not None and (self.gain is not None or self.lead.gain is None):
            raise ValueError(
                "buckets: a lead (a size and its gain) goes only with the job's own size kept"
            )

    def describe(self) -> str:
        """``DDP's buckets at 4 MiB (0.82x over 12 pairs of blocks)``."""
        from autotune.util.units import format_bytes

        size = f"DDP's buckets at {format_bytes(self.bucket_bytes)}"
        if self.gain is not None:
            return f"{size} ({self.gain.over('blocks')})"
        if self.lead is None:
            return f"{size} (the job's own: no other size beat them)"
        return f"{size} (the job's own: no other size beat them; {self.lead.describe()} came close)"

    def to_json(self) -> dict[str, object]:
        gain = None if self.gain is None else self.gain.to_json()
        out: dict[str, object] = {"bucket_bytes": self.bucket_bytes, "gain": gain}
        if self.lead is not None:
            out["lead"] = self.lead.to_json()
        return out

    @classmethod
    def from_json(cls, data: object) -> Buckets:
        if not isinstance(data, dict):
            raise ValueError(f"buckets: expected an object, got {data!r}")
        size = data.get("bucket_bytes")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"buckets: bucket_bytes must be an int > 0 (bytes), got {size!r}")
        gain, lead = data.get("gain"), data.get("lead")
        return cls(
            size,
            None if gain is None else Gain.from_json(gain),
            None if lead is None else Buckets.from_json(lead),
        )


def choice_json(choice: Choice) -> dict[str, object]:
    out: dict[str, object] = {"algorithm": choice.algorithm, "segment_bytes": choice.segment_bytes}
    if choice.wire is not None:  # a plan stored before compression has no such key
        out["wire"] = choice.wire
    return out


def read_class(key: object, where: str) -> int:
    """A size class from a table's key: a power of two, as a string."""
    try:
        size = int(str(key))
    except ValueError:
        raise ValueError(f"{where}: size classes are powers of two, got {key!r}") from None
    if size <= 0 or size != size_class(size):
        raise ValueError(f"{where}: size classes are powers of two, got {key}")
    return size


def read_choice(raw: object, names: list[str], where: str) -> Choice:
    """A choice from a table's JSON, with a registered algorithm and a segment a job may run."""
    try:
        if not isinstance(raw, dict):
            raise TypeError(f"expected an object, got {raw!r}")
        wire = raw.get("wire")
        if wire is not None and not isinstance(wire, str):
            raise TypeError(f"wire: expected a name, got {wire!r}")
        choice = Choice(raw["algorithm"], _optional_int(raw.get("segment_bytes")), wire)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc!r}") from None
    if choice.algorithm not in names:
        what = unknown("algorithm", [choice.algorithm], names)
        raise ValueError(f"{where}: {what}; registered: {', '.join(names)}")
    check_segment_bytes(choice.segment_bytes, f"{where}: segment_bytes")
    return choice


def _optional_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int or null, got {value!r}")
    return value
