"""What a job asks of autotune: one dataclass, every field also settable as ``AUTOTUNE_<FIELD>``."""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from autotune.algorithms import ALGORITHMS, BUILTINS, WIRES, available, split_label
from autotune.comm.topology import NODE_ID_ENV
from autotune.plan import check_fusion_bytes, check_segment_bytes
from autotune.storage.fingerprint import check_workload
from autotune.storage.store import as_url
from autotune.util.names import nearest, typo_of
from autotune.util.names import unknown as unknown_names
from autotune.util.redact import redact
from autotune.util.units import parse_bytes

__all__ = [
    "DEPRECATED_FIELDS",
    "ENV_PREFIX",
    "MAX_TIMEOUT_S",
    "NETNS_TAG_ENV",
    "OTHER_VARIABLES",
    "Config",
]

ENV_PREFIX = "AUTOTUNE_"

#: The longest `Config.timeout_s`, a week. gloo adds a timeout to its steady clock in
#: nanoseconds: 1e10 s wrapped and failed a healthy job's first step, blaming a healthy rank.
MAX_TIMEOUT_S = 7 * 24 * 3600.0

#: Tags the network namespaces a test run makes (autotune.testing.cluster), so that each run
#: removes only its own.
NETNS_TAG_ENV = "AUTOTUNE_NETNS_TAG"

#: Variables of ours that are not Config fields, and who reads them.
OTHER_VARIABLES = {
    NODE_ID_ENV: "autotune.comm.topology: which ranks share a node",
    NETNS_TAG_ENV: "autotune.testing.cluster: tags the network namespaces a test run makes",
    # Read by the autotune-nccl library (NCCL's tuner and profiler plugins): docs/NCCL_TUNER.md,
    # docs/NCCL_PROFILER.md.
    "AUTOTUNE_NCCL_TABLE": "autotune-nccl's tuner: the table it steers NCCL by (CSV)",
    "AUTOTUNE_NCCL_PROFILER": "autotune-nccl's profiler: 0 asks NCCL for no events",
    "AUTOTUNE_NCCL_SHM": "autotune-nccl's profiler: 0 keeps no node file for autotune daemon",
    "AUTOTUNE_NCCL_SHM_DIR": "autotune-nccl's profiler: where the node files go (/dev/shm)",
    "AUTOTUNE_NCCL_PROFILER_CHAIN": "autotune-nccl's profiler: a second profiler it loads",
    "AUTOTUNE_NCCL_PROFILER_SAMPLE": "autotune-nccl's profiler: record every Nth collective",
}


@dataclass(frozen=True)
class Config:
    """How the comm hook all-reduces gradient buckets.

    Example::

        >>> autotune.Config(algorithm="ring", segment_bytes=1 << 20, fusion_bytes=4 << 20)
    """

    algorithm: str = "auto"
    """A registered algorithm name (``autotune algorithms`` lists them), or "auto": chosen per
    message-size class by the live tuner, which starts from the backend's own all-reduce
    (``native``, the baseline) and keeps it unless a plan makes the training step faster. A fixed
    algorithm on a compressed wire is named with it: ``"native+bf16"`` (see `compression`)."""

    algorithms: tuple[str, ...] | None = None
    """The candidates "auto" may choose from; None: every built-in algorithm, and those a plugin
    adds to "auto" (NCCL's own algorithm x protocol with autotune-nccl). Either way, those the
    job's group cannot run are left out (`AllReduceAlgorithm.offered`)."""

    segment_bytes: int | None = None
    """Pipeline segment for a fixed algorithm; None: the algorithm's own default. At least 4 KiB
    (`autotune.plan.MIN_SEGMENT_BYTES`). A size such as ``"64K"`` is read as the environment
    variable's (this and `fusion_bytes`)."""

    fusion_bytes: int | None = None
    """Message size the hook aims for: consecutive smaller buckets are fused up to it, larger ones
    are sent in pieces of at most this size. 0 keeps DDP's buckets exactly as they are; None lets
    the tuner choose it with "auto" (and means 0 with a fixed algorithm). At least 4 KiB
    (`autotune.plan.MIN_FUSION_BYTES`) unless 0."""

    storage: str | None = None
    """Optuna storage URL for tuned plans (``sqlite:///...``, ``postgresql://...``); None: an
    SQLite file under the user cache directory."""

    workload: str | None = None
    """The name this job's plan is stored under, beside the fingerprint (backend, world size,
    nodes, device, dtype); None: the job's gradient layout names it (the bytes and dtype of each
    bucket as DDP first builds them), so runs of the same model under the same DDP settings
    share a plan and other models keep theirs. Name it to keep one plan across changes that
    move DDP's buckets. A size class's screening is shared by every workload either way
    (docs/TUNER.md, "Persistence")."""

    metrics_port: int | None = None
    """First port of the per-rank Prometheus exporter (a rank serves port + its local rank);
    0: any free port (``state.exporter.port`` says which); None: no exporter."""

    metrics_host: str = "127.0.0.1"
    """Address the exporter binds; "0.0.0.0" to let a Prometheus on another host scrape it."""

    job: str | None = None
    """A ``job`` label on every series, if set (Prometheus adds its own from the scrape config).
    A label only: the plan is stored per `workload`."""

    timeout_s: float = 600.0
    """How long any rank waits for a peer before the all-reduce raises, in seconds; at most a
    week (`MAX_TIMEOUT_S`)."""

    tune_warmup: int = 2
    """Occurrences of a newly chosen configuration the tuner discards before measuring it."""

    tune_samples: int = 5
    """Occurrences the tuner measures per screening trial; the trial's value is their median."""

    tune_trials: int = 20
    """Screening trials per size class before its fastest choice is shortlisted."""

    max_pairs: int = 24
    """Most pairs of iterations a paired test of two plans runs before the challenger, not proven
    faster on the step, loses (docs/TUNER.md); at least 6. Was ``duel_pairs`` (still accepted, for
    one release, with a DeprecationWarning)."""

    recheck_every: int = 200
    """Iterations between re-checks of a locked plan against the baseline; 0: never."""

    unhook: bool = True
    """Once the tuner keeps the baseline (no plan beat the backend's own all-reduce on DDP's
    buckets), give DDP its reducer back without the hook, so the job runs as plain DDP
    (`autotune.tuning.unhooked`); and before a plan that needs the hook is locked, make it beat
    plain DDP itself, in blocks of iterations on DDP's reducers (`autotune.tuning.plain_check`).
    False
    keeps the hook, and its per-bucket measurements, to the end, whatever is kept. Was
    ``step_aside`` (still accepted, for one release, with a DeprecationWarning)."""

    plan_file: str | None = None
    """A tuned table (``autotune show --json``) to run as a fixed plan, without tuning."""

    compression: tuple[str, ...] = ()
    """Wire dtypes ("bf16", "fp16") "auto" may send a size class's gradients in, where that makes
    the training step faster (docs/HOOK.md, "Compression"): the gradients divided by the world
    size, cast, summed in that dtype and cast back. () (the default): never; no tuned, stored or
    swept plan then runs a compressed choice. Only fp32 and fp64 gradients are compressed. A plan
    file may still fix one (``"wire": "bf16"`` in a class's choice)."""

    def __repr__(self) -> str:
        # A storage URL's password never reaches a log line or a traceback through the repr.
        body = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return redact(f"Config({body})")

    def __post_init__(self) -> None:
        names = available()
        fixed, wire = split_label(str(self.algorithm))
        if self.algorithm != "auto" and fixed not in names:
            raise ValueError(
                f"Config.algorithm: {unknown_names('algorithm', [fixed], names)}; use "
                f"'auto' or one of {', '.join(names)}"
            )
        if wire is not None and wire not in WIRES:
            raise ValueError(
                f"Config.algorithm: {unknown_names('wire dtype', [wire], list(WIRES))} after "
                f"'+'; use {' or '.join(f'{fixed}+{w}' for w in WIRES)}"
            )
        if self.algorithms is not None:
            if isinstance(self.algorithms, str) or not all(
                isinstance(a, str) for a in self.algorithms
            ):
                raise TypeError(
                    f"Config.algorithms: expected a tuple of names, got {self.algorithms!r}"
                )
            object.__setattr__(self, "algorithms", tuple(self.algorithms))
            unknown = [a for a in self.algorithms if a not in names]
            if unknown or not self.algorithms:
                what = unknown_names("algorithm", unknown, names) if unknown else "empty"
                raise ValueError(f"Config.algorithms: {what}; choose from {', '.join(names)}")
        _check_compression(self)
        for name in ("segment_bytes", "fusion_bytes"):
            # "4M", as AUTOTUNE_FUSION_BYTES takes it (it was a TypeError here alone).
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    object.__setattr__(self, name, parse_bytes(value))
                except ValueError as exc:
                    raise ValueError(f"Config.{name}: {exc}") from None
        check_segment_bytes(self.segment_bytes, "Config.segment_bytes")
        check_fusion_bytes(self.fusion_bytes, "Config.fusion_bytes")
        _check_int("tune_warmup", self.tune_warmup, minimum=0)
        _check_int("tune_samples", self.tune_samples, minimum=1)
        _check_int("tune_trials", self.tune_trials, minimum=1)
        _check_int("max_pairs", self.max_pairs, minimum=6)
        _check_int("recheck_every", self.recheck_every, minimum=0)
        if not isinstance(self.unhook, bool):
            raise TypeError(f"Config.unhook: expected True or False, got {self.unhook!r}")
        if self.plan_file is not None and self.algorithm != "auto":
            raise ValueError(
                "Config.plan_file: a tuned table chooses per size class; it needs "
                f"algorithm='auto', got algorithm={self.algorithm!r}"
            )
        _check_int("metrics_port", self.metrics_port, minimum=0, maximum=65535, optional=True)
        if (
            not isinstance(self.metrics_host, str)
            or not self.metrics_host
            or self.metrics_host != self.metrics_host.strip()
            or " " in self.metrics_host
        ):
            raise ValueError(f"Config.metrics_host: expected an address, got {self.metrics_host!r}")
        if self.workload is not None:
            check_workload(self.workload)
        if self.job is not None and (not isinstance(self.job, str) or not self.job):
            raise ValueError(f"Config.job: expected a non-empty label value, got {self.job!r}")
        if self.storage is not None:
            if not isinstance(self.storage, str) or not self.storage.strip():
                raise ValueError(
                    "Config.storage: expected an Optuna storage URL such as "
                    "'sqlite:///path/to/autotune.db' or 'postgresql://host/db', or a file's path "
                    "(SQLite), got " + redact(repr(self.storage))
                )
            try:
                url = as_url(self.storage.strip())
            except ValueError as exc:
                raise ValueError(f"Config.storage: {exc}") from None
            object.__setattr__(self, "storage", url)
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or not math.isfinite(self.timeout_s)
            or not 0 < self.timeout_s <= MAX_TIMEOUT_S
        ):
            raise ValueError(
                "Config.timeout_s: expected a positive number of seconds, at most "
                f"{MAX_TIMEOUT_S:.0f} (a week: the backends add it to a clock in nanoseconds, "
                f"which a longer one overflows), got {self.timeout_s!r}"
            )

    @property
    def candidates(self) -> tuple[str, ...]:
        """The algorithms "auto" chooses among, before the group leaves out what it cannot run
        (`autotune.algorithms.agreed`)."""
        if self.algorithms is not None:
            return self.algorithms
        builtins = tuple(cls.name for cls in BUILTINS)
        joining = sorted(n for n, cls in ALGORITHMS.items() if cls.joins_auto and n not in builtins)
        return builtins + tuple(joining)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Build a Config from ``AUTOTUNE_<FIELD>`` variables; keyword arguments take precedence.

        Sizes accept K/M/G suffixes (``AUTOTUNE_FUSION_BYTES=4M``), lists are comma-separated
        (``AUTOTUNE_ALGORITHMS=ring,tree``), and ``none`` clears an optional field.
        """
        env = os.environ if environ is None else environ
        by_name = {f.name: f for f in fields(cls)}
        known = {ENV_PREFIX + name.upper(): f for name, f in by_name.items()}
        for old, new in DEPRECATED_FIELDS.items():
            key = ENV_PREFIX + old.upper()
            if key in env:
                if ENV_PREFIX + new.upper() in env:
                    raise ValueError(
                        f"{key} and {ENV_PREFIX + new.upper()} are both set: keep the second"
                    )
                _deprecated(key, ENV_PREFIX + new.upper(), stacklevel=3)
                known[key] = by_name[new]
        for key in env:
            if key.startswith(ENV_PREFIX) and key not in known and key not in OTHER_VARIABLES:
                ours = [*known, *OTHER_VARIABLES]
                slip = typo_of(key, ours)
                if slip is not None:
                    # A misspelt setting silently ignored is a setting the user believes is on.
                    raise ValueError(
                        f"{key} is not an autotune setting; did you mean {slip}? (settings: "
                        f"{', '.join(sorted(ours))})"
                    )
                # Another tool's variable that shares the prefix stops no job.
                close = nearest(key, ours)
                warnings.warn(
                    f"{key} is not an autotune setting, and is ignored"
                    + (f" (the nearest is {close})" if close else ""),
                    stacklevel=2,
                )
        values: dict[str, Any] = {}
        for key, f in known.items():
            if key in env:
                values[f.name] = _parse(f, env[key], key)
        from_env = {f"Config.{name}:": ENV_PREFIX + name.upper() for name in values}
        values.update(overrides)
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            # Name the variable the user set, not the field it became.
            text = str(exc)
            for prefix, key in from_env.items():
                if text.startswith(prefix) and prefix[len("Config.") : -1] not in overrides:
                    why = text[len(prefix) + 1 :]
                    raise type(exc)(redact(f"{key}={env[key]!r}: {why}")) from None
            raise

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied (and checked)."""
        return dataclasses.replace(self, **_renamed(changes))

    @property
    def step_aside(self) -> bool:
        """Deprecated: `unhook`."""
        _deprecated("Config.step_aside", "Config.unhook")
        return self.unhook

    @property
    def duel_pairs(self) -> int:
        """Deprecated: `max_pairs`."""
        _deprecated("Config.duel_pairs", "Config.max_pairs")
        return self.max_pairs


#: Old spellings kept for one release, as keyword arguments, attributes and ``AUTOTUNE_<OLD>``
#: variables: old field name -> new one.
DEPRECATED_FIELDS = {"step_aside": "unhook", "duel_pairs": "max_pairs"}


def _deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} is deprecated and goes in the next release: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def _renamed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the deprecated field names turned into the current ones (warned)."""
    out = dict(kwargs)
    for old, new in DEPRECATED_FIELDS.items():
        if old in out:
            value = out.pop(old)
            if new in out and out[new] != value:
                raise ValueError(f"Config: {old}={value!r} and {new}={out[new]!r} disagree")
            _deprecated(f"Config({old}=...)", f"Config({new}=...)", stacklevel=4)
            out[new] = value
    return out


_dataclass_init = Config.__init__


def _init(self: Config, *args: Any, **kwargs: Any) -> None:
    _dataclass_init(self, *args, **_renamed(kwargs))


# Config(step_aside=...) and Config(duel_pairs=...) still work for a release.
setattr(Config, "__init__", _init)  # noqa: B010 (mypy would refuse the assignment)


def _check_int(
    name: str, value: object, *, minimum: int, maximum: int | None = None, optional: bool = False
) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Config.{name}: expected an int, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"Config.{name}: must be {allowed}, got {value}")


def _parse(f: dataclasses.Field[Any], raw: str, key: str) -> Any:
    text = raw.strip()
    optional = "None" in str(f.type)
    if optional and text.lower() in ("", "none"):
        return None
    try:
        if f.name in ("segment_bytes", "fusion_bytes"):
            return parse_bytes(text)
        if f.name in (
            "metrics_port",
            "tune_warmup",
            "tune_samples",
            "tune_trials",
            "max_pairs",
            "recheck_every",
        ):
            return int(text)
        if f.name == "timeout_s":
            return float(text)
        if f.name == "unhook":
            return _parse_bool(text)
        if f.name in ("algorithms", "compression"):
            return tuple(a.strip() for a in text.split(",") if a.strip())
    except ValueError as exc:
        raise ValueError(f"{key}={raw!r}: {exc}") from None
    return text


def _check_compression(config: Config) -> None:
    """``Config.compression`` as a tuple of known wire dtypes, each once ("bf16,fp16" taken as
    the environment variable's)."""
    value = config.compression
    if isinstance(value, str):
        value = tuple(w.strip() for w in value.split(",") if w.strip())
    if not isinstance(value, (tuple, list)) or not all(isinstance(w, str) for w in value):
        raise TypeError(f"Config.compression: expected wire dtype names, got {value!r}")
    wires = tuple(value)
    unknown = [w for w in wires if w not in WIRES]
    if unknown:
        raise ValueError(
            f"Config.compression: {unknown_names('wire dtype', unknown, list(WIRES))}; choose "
            f"from {', '.join(WIRES)}, or () for none"
        )
    if len(set(wires)) != len(wires):
        raise ValueError(f"Config.compression: {', '.join(wires)} names a wire dtype twice")
    object.__setattr__(config, "compression", wires)


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/true/yes/on or 0/false/no/off")
