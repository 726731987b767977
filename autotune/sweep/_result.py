"""A sweep's results: one row per size and algorithm, as nccl-tests reports them; JSON and CSV."""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from autotune.ddp.stats import bus_factor
from autotune.plan import Table
from autotune.util.jsonfile import read_json
from autotune.util.redact import redact_url

__all__ = ["FORMAT_VERSION", "Row", "SweepResult", "bus_factor"]

#: Bumped when the JSON's meaning changes; `SweepResult.load` refuses other versions.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Row:
    """One message size run by one algorithm (or by the tuned plan, or point-to-point)."""

    bytes: int
    count: int
    type: str
    algorithm: str  # a registered algorithm, "tuned" (the stored plan), or "p2p"
    segment_bytes: int | None  # None: the algorithm's default
    time_us: float  # median over iterations of the slowest rank's time
    algbw_gbps: float  # bytes / time, GB/s (1e9)
    busbw_gbps: float  # algbw * 2(n-1)/n for all-reduce; algbw for p2p
    wrong: int | None  # elements that differed from the exact result, over ranks; None: unchecked
    times_us: tuple[float, ...] = ()  # every timed iteration, the slowest rank's
    cpu_us: float | None = None  # process CPU time per call (median, slowest rank)
    chosen: str | None = None  # for "tuned": the algorithm the plan ran at this size

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Row:
        names = {f.name for f in fields(cls)}
        missing = names - set(raw) - {"times_us", "cpu_us", "chosen"}
        if missing:
            raise ValueError(f"a result row lacks {', '.join(sorted(missing))}")
        values = {k: v for k, v in raw.items() if k in names}
        values["times_us"] = tuple(values.get("times_us", ()))
        return cls(**values)


@dataclass
class SweepResult:
    """Everything one sweep measured, with what it ran on and how to run it again."""

    world_size: int
    backend: str
    device: str  # the device model the tensors lived on
    dtype: str  # nccl-tests' type name
    command: str
    machine: str
    options: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    p2p: list[Row] = field(default_factory=list)
    plan: Table | None = None  # the tuned plan (with --tune)
    plan_key: str | None = None  # its fingerprint key in the storage
    storage: str | None = None  # where it was stored
    candidates: list[str] | None = None  # what tuning chose among
    node_of: list[int] | None = (
        None  # each rank's node, as the ranks found (autotune.comm.topology)
    )

    @property
    def wrong(self) -> int:
        """Wrong elements over every checked row."""
        return sum(r.wrong or 0 for r in [*self.rows, *self.p2p])

    def fingerprint(self) -> dict[str, str | int]:
        """The fingerprint of the job this sweep stands for
        (`autotune.storage.fingerprint.fingerprint`)."""
        from autotune.comm.topology import Topology
        from autotune.storage import fingerprint
        from autotune.sweep._options import DTYPES

        topo = Topology(tuple(self.node_of or [0] * self.world_size))
        return fingerprint(
            backend=self.backend,
            world_size=self.world_size,
            nodes=topo.nodes,
            ranks_per_node=topo.layout,
            device=self.device,
            dtype=str(DTYPES[self.dtype]).removeprefix("torch."),
        )

    def algorithms(self) -> list[str]:
        """The row labels in the order they were swept."""
        return list(dict.fromkeys(r.algorithm for r in self.rows))

    def avg_busbw_gbps(self) -> dict[str, float]:
        """Per algorithm, the mean bus bandwidth over sizes (nccl-tests' "Avg bus bandwidth")."""
        return {
            name: statistics.fmean(r.busbw_gbps for r in self.rows if r.algorithm == name)
            for name in self.algorithms()
        }

    def tuned_vs_best(self) -> list[tuple[Row, Row]]:
        """Per size, the tuned row and the row of the fastest fixed algorithm among the tuning
        candidates (measured in the same iterations)."""
        out = []
        for tuned in (r for r in self.rows if r.algorithm == "tuned"):
            fixed = [
                r
                for r in self.rows
                if r.bytes == tuned.bytes
                and r.algorithm != "tuned"
                and (self.candidates is None or r.algorithm in self.candidates)
            ]
            if fixed:
                out.append((tuned, min(fixed, key=lambda r: r.time_us)))
        return out

    def p2p_efficiency(self) -> dict[str, dict[int, float]]:
        """Per algorithm and size, busbw over the point-to-point bandwidth at that size."""
        ceiling = {r.bytes: r.busbw_gbps for r in self.p2p if r.busbw_gbps > 0}
        out: dict[str, dict[int, float]] = {}
        for r in self.rows:
            if r.bytes in ceiling:
                out.setdefault(r.algorithm, {})[r.bytes] = r.busbw_gbps / ceiling[r.bytes]
        return out

    # -- files ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "autotune-sweep",
            "version": FORMAT_VERSION,
            "world_size": self.world_size,
            "backend": self.backend,
            "device": self.device,
            "dtype": self.dtype,
            "command": self.command,
            "machine": self.machine,
            "options": self.options,
            "rows": [asdict(r) for r in self.rows],
            "p2p": [asdict(r) for r in self.p2p],
            "avg_busbw_gbps": self.avg_busbw_gbps(),
            "plan": None if self.plan is None else self.plan.to_json(),
            "plan_key": self.plan_key,
            "storage": None if self.storage is None else redact_url(self.storage),
            "candidates": self.candidates,
            "node_of": self.node_of,
        }

    @classmethod
    def from_json(cls, data: Any) -> SweepResult:
        if not isinstance(data, dict) or data.get("format") != "autotune-sweep":
            raise ValueError("not an autotune sweep result (written by `autotune sweep --json`)")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"sweep result format version {data.get('version')!r}; this autotune reads "
                f"version {FORMAT_VERSION}"
            )
        try:
            return cls(
                world_size=int(data["world_size"]),
                backend=str(data["backend"]),
                device=str(data["device"]),
                dtype=str(data["dtype"]),
                command=str(data["command"]),
                machine=str(data["machine"]),
                options=dict(data["options"]),
                rows=[Row.from_json(r) for r in data["rows"]],
                p2p=[Row.from_json(r) for r in data.get("p2p", [])],
                plan=None if data.get("plan") is None else Table.from_json(data["plan"]),
                plan_key=data.get("plan_key"),
                storage=data.get("storage"),
                candidates=data.get("candidates"),
                node_of=data.get("node_of"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed sweep result: {exc!r}") from None

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> SweepResult:
        """Read a file `save` wrote; errors name the file and what is wrong with it."""
        return read_json(path, cls.from_json)

    def csv(self) -> str:
        """One line per row (point-to-point rows too), nccl-tests' columns first."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(
            [
                "size_bytes",
                "count",
                "type",
                "algorithm",
                "segment_bytes",
                "time_us",
                "algbw_gbps",
                "busbw_gbps",
                "wrong",
                "chosen",
                "world_size",
                "backend",
            ]
        )
        for r in [*self.rows, *self.p2p]:
            writer.writerow(
                [
                    r.bytes,
                    r.count,
                    r.type,
                    r.algorithm,
                    "" if r.segment_bytes is None else r.segment_bytes,
                    f"{r.time_us:.3f}",
                    f"{r.algbw_gbps:.6f}",
                    f"{r.busbw_gbps:.6f}",
                    "" if r.wrong is None else r.wrong,
                    r.chosen or "",
                    self.world_size,
                    self.backend,
                ]
            )
        return out.getvalue()
