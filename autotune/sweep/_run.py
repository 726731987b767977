"""Run a sweep on every rank of a group; rank 0 prints the table as rows finish and writes files."""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import statistics
import sys
from datetime import timedelta
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms import ALGORITHMS, agreed, backend_for
from autotune.comm import topology
from autotune.comm.topology import Topology, local_rank
from autotune.plan import Entry, size_class
from autotune.storage import device_model, storage_url
from autotune.sweep._format import columns, footer, header, row_line
from autotune.sweep._measure import P2P, Bench, Measured, Variant, exact_limit
from autotune.sweep._options import SweepOptions
from autotune.sweep._result import Row, SweepResult, bus_factor
from autotune.sweep._tune import Tuned, class_trials, final_calls, tune
from autotune.util.units import format_bytes

__all__ = ["machine", "run_sweep", "tune_candidates"]


def machine(device: torch.device | None = None) -> str:
    """What the figures were measured on, for the record."""
    where = f"{device_model('cpu')}, {os.cpu_count()} cores"
    if device is not None and device.type == "cuda":
        where = f"{device_model('cuda', device.index)}, {where}"
    return (
        f"{where}, {platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def tune_candidates(options: SweepOptions) -> tuple[str, ...]:
    """What ``--tune`` chooses among: as given, else what a job's "auto" would (its config)."""
    if options.tune_algorithms is not None:
        return options.tune_algorithms
    from autotune.config import Config

    return Config.from_env().candidates


def _device(options: SweepOptions, group: ProcessGroup) -> torch.device:
    if options.device_type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda (or --backend nccl) needs a CUDA device; none is visible")
    local = local_rank(default=dist.get_rank(group))
    return torch.device("cuda", local % torch.cuda.device_count())


class _Out:
    """Rank 0's output: lines to ``out``, a progress bar on stderr when it is a terminal."""

    def __init__(self, out: TextIO, total: int, enabled: bool) -> None:
        self.out = out
        self.enabled = enabled
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="call", file=sys.stderr, leave=False)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.out)
        else:
            print(text, file=self.out, flush=True)

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _rows(
    count: int,
    options: SweepOptions,
    variants: list[Variant],
    measured: Measured,
    world_size: int,
) -> list[Row]:
    nbytes = count * options.torch_dtype.itemsize
    rows = []
    for j, v in enumerate(variants):
        times = [it[j] for it in measured.seconds]
        seconds = statistics.median(times)
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        factor = 1.0 if v.algorithm == P2P else bus_factor(world_size)
        rows.append(
            Row(
                bytes=nbytes,
                count=count,
                type=options.dtype,
                algorithm=v.label,
                segment_bytes=v.segment_bytes,
                time_us=seconds * 1e6,
                algbw_gbps=algbw,
                busbw_gbps=algbw * factor,
                wrong=None if measured.wrong is None else measured.wrong[j],
                times_us=tuple(t * 1e6 for t in times),
                cpu_us=statistics.median(it[j] for it in measured.cpu_seconds) * 1e6,
                chosen=v.algorithm if v.label == "tuned" else None,
            )
        )
    return rows


def run_sweep(
    options: SweepOptions,
    group: ProcessGroup | None = None,
    *,
    command: str = "",
    out: TextIO | None = None,
    json_path: str | None = None,
    csv_path: str | None = None,
) -> SweepResult:
    """Sweep on every rank of ``group`` (collective); every rank returns the same result.

    Rank 0 prints the table to ``out`` (default stdout) as each size finishes, and writes
    ``json_path`` and ``csv_path`` if given.
    """
    group = group if group is not None else dist.group.WORLD
    assert group is not None, "the default process group is not initialised"
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    device = _device(options, group)
    dtype = options.torch_dtype
    if options.check and n > exact_limit(dtype):
        raise ValueError(
            f"the check sums {n} ranks' inputs exactly only up to {exact_limit(dtype)} ranks in "
            f"{options.dtype}; pass -c 0 or a wider dtype"
        )
    counts = options.counts()
    p2p = options.p2p and n > 1
    timeout = timedelta(seconds=options.timeout_s)
    topo = topology.detect(group, timeout)
    names = agreed(options.swept, group, device, timeout)
    if options.algorithms is not None and names != options.algorithms:
        left_out = [a for a in options.algorithms if a not in names]
        raise ValueError(f"{', '.join(left_out)} cannot run here (the log says why)")
    swept = [
        Variant(a, a, options.segment_bytes if ALGORITHMS[a].segmented else None) for a in names
    ]
    candidates: tuple[str, ...] = ()
    if options.tune:
        given = tune_candidates(options)
        candidates = agreed(given, group, device, timeout)
        if not candidates:
            raise ValueError(f"--tune: none of {', '.join(given)} can run here (the log says why)")
    classes = sorted({size_class(c * dtype.itemsize) for c in counts if c})
    per_size = options.check + options.warmup + options.iters
    total = sum(
        len(swept) + (1 if options.tune and c else 0) + (1 if p2p and c else 0) for c in counts
    )
    total *= per_size
    total += sum(
        class_trials(cls, candidates, options.tune_trials, topo)
        * (1 + options.warmup + options.iters)
        + final_calls(options.iters, options.warmup)
        for cls in (classes if options.tune else [])
    )
    printer = _Out(out or sys.stdout, total, rank == 0)
    bench = Bench(group, device, dtype, options.timeout_s, printer.advance)
    storage = ""
    if options.tune:
        storage = storage_url(options.storage)
    result = SweepResult(
        world_size=n,
        backend=backend_for(group, device),
        device=device_model(device.type, device.index),
        dtype=options.dtype,
        command=command,
        machine=machine(device),
        options=dataclasses.asdict(options),
        node_of=list(topo.node_of),
    )
    try:
        ranks: list[Any] = [None] * n
        dist.all_gather_object(ranks, (socket.gethostname(), os.getpid(), str(device)), group)
        for line in header(
            result,
            [
                f"Rank {r:2d} Pid {pid:7d} on {host} device {dev}"
                for r, (host, pid, dev) in enumerate(ranks)
            ],
        ):
            printer.line(line)
        tuned = Tuned({})
        if options.tune:
            tuned = _tune(bench, options, classes, candidates, storage, printer, topo)
            result.plan, result.plan_key = tuned.table, tuned.key
            result.storage = storage
            result.candidates = list(candidates)
        for line in columns():
            printer.line(line)
        for count in counts:
            variants = list(swept)
            choice = tuned.choices.get(size_class(count * dtype.itemsize)) if count else None
            if choice is not None:
                variants.append(Variant("tuned", choice.algorithm, choice.segment_bytes))
            if p2p and count:
                variants.append(Variant(P2P, P2P))
            printer.describe(f"{format_bytes(count * dtype.itemsize)}")
            measured = bench.measure(
                count, variants, iters=options.iters, warmup=options.warmup, check=options.check
            )
            for row in _rows(count, options, variants, measured, n):
                if row.algorithm == P2P:
                    result.p2p.append(row)
                else:
                    result.rows.append(row)
                    printer.line(row_line(row))
    finally:
        printer.close()
    for line in footer(result):
        printer.line(line)
    if rank == 0:
        if options.tune and result.plan_key is not None:
            _store_prior(result, storage, printer)
        if json_path:
            result.save(json_path)
            printer.line(f"# wrote {json_path}")
        if csv_path:
            with open(csv_path, "w") as f:
                f.write(result.csv())
            printer.line(f"# wrote {csv_path}")
    return result


def _store_prior(result: SweepResult, storage: str, printer: _Out) -> None:
    """Fit the cost model to the sweep and store it as the live tuner's prior (docs/MODEL.md)."""
    from autotune.model import Prior
    from autotune.sweep._prior import store_prior

    assert result.plan_key is not None
    try:
        fitted = store_prior(storage, [result], result.plan_key)
    except ValueError as exc:  # too few modelled measurements to fit
        printer.line(f"# no cost-model prior stored: {exc}")
        return
    bound = Prior.from_fit(fitted).worst_error
    printer.line(
        f"# stored the cost model's fit as the tuner's prior (median error "
        f"{fitted.median_error():.0%}, worst {fitted.worst_error():.0%}; {bound:.0%} without "
        "native, which it never leaves out)"
    )


def _tune(
    bench: Bench,
    options: SweepOptions,
    classes: list[int],
    candidates: tuple[str, ...],
    storage: str,
    printer: _Out,
    topo: Topology,
) -> Tuned:
    printer.line(
        f"# Tuning {len(classes)} size classes over {', '.join(candidates)} x segment sizes "
        f"(up to {options.tune_trials} trials each), measured as below..."
    )

    def on_class(cls: int, entry: Entry | None) -> None:
        printer.describe(f"tuned {format_bytes(cls)}")
        if entry is None:
            printer.line(f"# {format_bytes(cls)}: every candidate summed wrong; left untuned")

    return tune(
        bench,
        classes,
        candidates,
        budget=options.tune_trials,
        iters=options.iters,
        warmup=options.warmup,
        storage=storage,
        topo=topo,
        on_class=on_class,
    )
