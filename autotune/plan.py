"""Message-size classes, the choice made for each, and the plan that maps one to the other."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = [
    "BASELINE_CHOICE",
    "MIN_FUSION_BYTES",
    "PLAN_COLUMNS",
    "STATES",
    "Arm",
    "Buckets",
    "Choice",
    "Entry",
    "Gain",
    "Lead",
    "Plan",
    "Table",
    "check_fusion_bytes",
    "load_table",
    "plan_rows",
    "segment_text",
    "size_class",
]

#: The smallest fusion size (bytes) that is not 0 (off). Below a page, every bucket becomes
#: thousands of latency-bound messages: a 3-byte fusion size once made a step take 78 s.
MIN_FUSION_BYTES = 4096

#: What a size class's entry in a tuned table can say about it.
STATES = ("default", "exploring", "locked", "fixed")


def segment_text(choice: Choice) -> str:
    """A choice's segment as every table shows it: "-" where the algorithm has none (or is not
    registered here), "default" for the algorithm's own, else the size ("256 KiB")."""
    from autotune.algorithms import ALGORITHMS
    from autotune.util.units import format_bytes

    algo = ALGORITHMS.get(choice.algorithm)
    if algo is None or not algo.segmented:
        return "-"
    return "default" if choice.segment_bytes is None else format_bytes(choice.segment_bytes)


#: The columns of `plan_rows`.
PLAN_COLUMNS = ("size class", "algorithm", "segment", "median (us)", "trials")


def plan_rows(table: Table) -> list[tuple[int, tuple[str, str, str, str, str]]]:
    """A tuned table's cells, one row per size class (smallest first), as every plan table shows
    them (`PLAN_COLUMNS`); each renderer lays them out (text, markdown, a figure)."""
    from autotune.util.units import format_bytes

    return [
        (
            cls,
            (
                format_bytes(cls),
                e.choice.algorithm,
                segment_text(e.choice),
                "-" if e.best_s is None else f"{e.best_s * 1e6:.1f}",
                str(e.trials),
            ),
        )
        for cls, e in sorted(table.classes.items())
    ]


def check_fusion_bytes(value: object, where: str) -> None:
    """Raise if ``value`` is no fusion size: None, 0 (off), or at least `MIN_FUSION_BYTES`.

    ``where`` names the source for the message (``Config.fusion_bytes``, a plan file, ...).
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: expected an int (bytes), got {value!r}")
    if value < 0 or 0 < value < MIN_FUSION_BYTES:
        raise ValueError(
            f"{where}: must be 0 (DDP's buckets as they are) or at least {MIN_FUSION_BYTES} "
            f"bytes, got {value}"
        )


def size_class(nbytes: int) -> int:
    """The power of two a message of ``nbytes`` belongs to: class c holds sizes in (c/2, c]."""
    if nbytes < 0:
        raise ValueError(f"message size must be >= 0, got {nbytes}")
    return 1 << max(nbytes - 1, 0).bit_length()


@dataclass(frozen=True)
class Choice:
    """What runs a message: an algorithm, and its pipeline segment (None: the algorithm's own)."""

    algorithm: str
    segment_bytes: int | None = None

    def __str__(self) -> str:
        """``ring`` or, with a segment, ``ring/256 KiB``: how logs and verdicts name it."""
        from autotune.util.units import format_bytes

        if self.segment_bytes is None:
            return self.algorithm
        return f"{self.algorithm}/{format_bytes(self.segment_bytes)}"


#: What every size class runs in the baseline (the job without autotune), and wherever a plan
#: says nothing.
BASELINE_CHOICE = Choice("native")


@dataclass(frozen=True)
class Arm:
    """A whole plan: the choices that differ from `BASELINE_CHOICE`, and the fusion size."""

    choices: tuple[tuple[int, Choice], ...] = ()
    fusion_bytes: int = 0

    @staticmethod
    def of(choices: Mapping[int, Choice], fusion_bytes: int) -> Arm:
        kept = sorted((cls, c) for cls, c in choices.items() if c != BASELINE_CHOICE)
        return Arm(tuple(kept), fusion_bytes)

    def as_dict(self) -> dict[int, Choice]:
        return dict(self.choices)

    def choice(self, cls: int) -> Choice:
        return self.as_dict().get(cls, BASELINE_CHOICE)

    def with_class(self, cls: int, choice: Choice) -> Arm:
        return Arm.of({**self.as_dict(), cls: choice}, self.fusion_bytes)

    def with_fusion(self, fusion_bytes: int) -> Arm:
        return Arm(self.choices, fusion_bytes)

    def describe(self) -> str:
        from autotune.util.units import format_bytes

        parts = [f"{format_bytes(cls)}: {c}" for cls, c in self.choices]
        fusion = f"fusion {format_bytes(self.fusion_bytes)}" if self.fusion_bytes else ""
        return ", ".join([*parts, *([fusion] if fusion else [])]) or "native"


#: Picks the choice for a size class.
Rule = Callable[[int], Choice]


class Plan:
    """Per size class, what to run: explicit choices over a default rule. Safe across threads."""

    def __init__(self, default: Rule | Choice | None = None) -> None:
        self._default: Rule | None = None
        self._chosen: dict[int, Choice] = {}
        self._seen: set[int] = set()
        self._lock = threading.Lock()
        if default is not None:
            self.set_default(default)

    def set_default(self, default: Rule | Choice) -> None:
        """The choice for size classes without an explicit one: a fixed choice, or a rule."""
        if isinstance(default, Choice):
            fixed = default
            self._default = lambda nbytes: fixed
        else:
            self._default = default

    def _fallback(self, cls: int) -> Choice:
        assert self._default is not None, "the plan has no default rule yet"
        return self._default(cls)

    def choice(self, nbytes: int) -> Choice:
        """What runs a message of ``nbytes`` (and note that its class occurs in this job)."""
        cls = size_class(nbytes)
        with self._lock:
            self._seen.add(cls)
            chosen = self._chosen.get(cls)
        return chosen if chosen is not None else self._fallback(cls)

    def set(self, cls: int, choice: Choice) -> None:
        """Run ``choice`` for every message of size class ``cls`` from now on."""
        if cls != size_class(cls):
            raise ValueError(f"size classes are powers of two, got {cls}")
        with self._lock:
            self._chosen[cls] = choice

    def replace(self, chosen: dict[int, Choice]) -> None:
        """Run exactly ``chosen`` (size class -> choice) from now on, the default elsewhere."""
        with self._lock:
            self._chosen = dict(chosen)

    def table(self) -> dict[int, Choice]:
        """The choice for every size class seen so far, smallest first."""
        with self._lock:
            seen = sorted(self._seen)
            chosen = dict(self._chosen)
        return {cls: chosen.get(cls) or self._fallback(cls) for cls in seen}


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
        return f"{self.ratio:.2f}x over {self.pairs} pairs" + (
            f" of {pairs_of}" if pairs_of else ""
        )

    def verdict(self, pairs_of: str, what: str) -> str:
        """The summary line of a job whose step this gain measures against plain DDP's."""
        high = "?" if math.isinf(self.high) else f"{self.high:.2f}"
        return (
            f"autotune vs plain DDP: {self.ratio:.2f}x step time ({self.pairs} pairs of "
            f"{pairs_of}, 95% interval {self.low:.2f}-{high}x; {what})"
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


@dataclass(frozen=True)
class Lead:
    """A plan that was ahead of the baseline on the step but not beyond noise, when a job kept
    the baseline: the next job with the same fingerprint duels it against the baseline once more
    before it steps aside (`autotune.tuning.campaign`). ``gain`` is what the first job measured."""

    arm: Arm
    gain: Gain

    def describe(self) -> str:
        """``fusion 16 MiB (0.95x over 24 pairs)``, as the verdict and ``autotune show`` say it."""
        return f"{self.arm.describe()} ({self.gain.over()})"

    def to_json(self) -> dict[str, object]:
        return {
            "fusion_bytes": self.arm.fusion_bytes,
            "choices": {str(cls): _choice_json(c) for cls, c in self.arm.choices},
            "gain": self.gain.to_json(),
        }

    @classmethod
    def from_json(cls, data: object) -> Lead:
        from autotune.algorithms import available

        if not isinstance(data, dict) or not isinstance(data.get("choices"), dict):
            raise ValueError(f"lead: expected an object with a 'choices' object, got {data!r}")
        names = available()
        choices = {}
        for key, raw in data["choices"].items():
            where = f"lead, class {key!r}"
            choices[_read_class(key, where)] = _read_choice(raw, names, where)
        fusion = data.get("fusion_bytes")
        if fusion is None:
            raise ValueError("lead: fusion_bytes must be an int (bytes), got null")
        check_fusion_bytes(fusion, "lead: fusion_bytes")
        assert isinstance(fusion, int)
        return cls(Arm.of(choices, fusion), Gain.from_json(data.get("gain")))


@dataclass(frozen=True)
class Buckets:
    """DDP's own bucket size that a job kept once autotune stepped aside
    (`autotune.tuning.buckets`), and its step over DDP's buckets as the job built them, plain DDP
    as the user set it up (None: that size is the job's own; no other beat it). Where the job's own
    was kept, ``lead`` is the size that came closest (ahead on the step, not beyond noise) with
    what it measured: the next job duels it once more."""

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


def _choice_json(choice: Choice) -> dict[str, object]:
    return {"algorithm": choice.algorithm, "segment_bytes": choice.segment_bytes}


def _read_class(key: object, where: str) -> int:
    """A size class from a table's key: a power of two, as a string."""
    try:
        size = int(str(key))
    except ValueError:
        raise ValueError(f"{where}: size classes are powers of two, got {key!r}") from None
    if size <= 0 or size != size_class(size):
        raise ValueError(f"{where}: size classes are powers of two, got {key}")
    return size


def _read_choice(raw: object, names: list[str], where: str) -> Choice:
    """A choice from a table's JSON, with a registered algorithm and a segment > 0."""
    try:
        if not isinstance(raw, dict):
            raise TypeError(f"expected an object, got {raw!r}")
        choice = Choice(raw["algorithm"], _optional_int(raw.get("segment_bytes")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc!r}") from None
    if choice.algorithm not in names:
        raise ValueError(
            f"{where}: unknown algorithm {choice.algorithm!r}; registered: {', '.join(names)}"
        )
    if choice.segment_bytes is not None and choice.segment_bytes <= 0:
        raise ValueError(f"{where}: segment_bytes must be > 0, got {choice.segment_bytes}")
    return choice


@dataclass(frozen=True)
class Table:
    """A tuned plan as stored and exported: per size class an entry, the job's fusion size, the
    plan's measured step over the baseline's (None: not compared), where the baseline was kept,
    the plan that came closest to beating it (`Lead`; None: none came close), and where autotune
    stepped aside, the bucket size DDP kept (`Buckets`; None: DDP's as the job built them)."""

    classes: dict[int, Entry]
    fusion_bytes: int | None = None
    fingerprint: dict[str, str | int] | None = None
    gain: Gain | None = None
    lead: Lead | None = None
    buckets: Buckets | None = None

    @property
    def runs_native(self) -> bool:
        """Whether every class runs the baseline: only then does a bucket size (`buckets`)
        apply, by stepping aside; a plan with a Python-driven class keeps the hook."""
        return all(e.choice == BASELINE_CHOICE for e in self.classes.values())

    def to_json(self) -> dict[str, object]:
        return {
            "fingerprint": self.fingerprint,
            "fusion_bytes": self.fusion_bytes,
            "gain": None if self.gain is None else self.gain.to_json(),
            "lead": None if self.lead is None else self.lead.to_json(),
            "buckets": None if self.buckets is None else self.buckets.to_json(),
            "classes": {
                str(cls): {
                    **_choice_json(e.choice),
                    "best_s": e.best_s,
                    "trials": e.trials,
                    "state": e.state,
                }
                for cls, e in sorted(self.classes.items())
            },
        }

    @classmethod
    def from_json(cls, data: object) -> Table:
        """Read `to_json`'s form back, checking every value the engine would run with.

        A ValueError says what is wrong and where: nothing in a table can reach the engine
        unchecked (a negative fusion size once silently turned off the all-reduce).
        """
        from autotune.algorithms import available

        if not isinstance(data, dict) or not isinstance(data.get("classes"), dict):
            raise ValueError("a plan table is a JSON object with a 'classes' object")
        names = available()
        classes: dict[int, Entry] = {}
        for key, raw in data["classes"].items():
            where = f"class {key!r}"
            size = _read_class(key, where)
            choice = _read_choice(raw, names, where)
            assert isinstance(raw, dict)
            trials = raw.get("trials", 0)
            best = raw.get("best_s")
            state = raw.get("state", "locked")
            if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0:
                raise ValueError(f"{where}: trials must be an int >= 0, got {trials!r}")
            if best is not None and (
                isinstance(best, bool)
                or not isinstance(best, (int, float))
                or not math.isfinite(best)
                or best < 0
            ):
                raise ValueError(f"{where}: best_s must be seconds >= 0 or null, got {best!r}")
            if state not in STATES:
                raise ValueError(f"{where}: state must be one of {', '.join(STATES)}: {state!r}")
            classes[size] = Entry(choice, None if best is None else float(best), trials, state)
        fusion = data.get("fusion_bytes")
        check_fusion_bytes(fusion, "fusion_bytes")
        assert fusion is None or isinstance(fusion, int)
        fingerprint = data.get("fingerprint")
        gain, lead, buckets = data.get("gain"), data.get("lead"), data.get("buckets")
        if buckets is not None and not cls(classes).runs_native:
            raise ValueError(
                "buckets: DDP's own bucket size is kept only where every class runs native "
                "(autotune applies it by stepping aside, without the hook)"
            )
        return cls(
            classes,
            fusion,
            fingerprint if isinstance(fingerprint, dict) else None,
            None if gain is None else Gain.from_json(gain),
            None if lead is None else Lead.from_json(lead),
            None if buckets is None else Buckets.from_json(buckets),
        )

    def nccl_csv(self, n_nodes: int = -1, n_ranks: int = -1) -> str:
        """The table as the NCCL example tuner plugin's CSV (``NCCL_TUNER_CONFIG_FILE``), which
        autotune's plugin reads too (``AUTOTUNE_NCCL_TABLE``).

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
        for size, entry in sorted(self.classes.items()):
            low = 0 if size == 1 else size // 2 + 1
            kind, _, cell = entry.choice.algorithm.partition(".")
            algo: str | None
            if kind == "nccl" and cell.count(".") == 1:
                algo, proto = cell.split(".")
            else:
                algo = nccl_names.get(entry.choice.algorithm)
                proto = "ll" if size <= 64 << 10 else "simple"
            if algo is None:
                skipped.append(f"{low}-{size}: {entry.choice.algorithm}")
                continue
            lines.append(f"allreduce,{low},{size},{algo},{proto},-1,{n_nodes},{n_ranks},-1,-1")
        if skipped:
            lines.append("# left to NCCL (no NCCL counterpart): " + "; ".join(skipped))
        return "\n".join(lines) + "\n"


def _optional_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int or null, got {value!r}")
    return value


def load_table(path: str) -> Table:
    """Read a table written by ``autotune show --json``; errors name the file and the problem."""
    from autotune.util.jsonfile import read_json

    return read_json(path, Table.from_json, "plan file")
