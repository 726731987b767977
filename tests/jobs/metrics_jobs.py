"""Jobs the metrics tests run on spawned ranks."""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tuner_jobs import BUCKET_CAP_MB, model

import autotune


def train_step(ddp: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    x, y = torch.randn(8, 256), torch.randint(0, 8, (8,))
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    opt.zero_grad()


def exposition(rank: int, world_size: int, storage: str) -> str:
    """Train a little with the tuner and the exporter on; return what /metrics served."""
    ddp = DDP(model(), bucket_cap_mb=BUCKET_CAP_MB)
    config = autotune.Config(
        metrics_port=0, storage=storage, job="test-job", tune_warmup=0, tune_samples=1
    )
    state = autotune.register(ddp, config)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for _ in range(30):
        train_step(ddp, opt)
    assert state.exporter is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{state.exporter.port}/metrics") as r:
        body: str = r.read().decode()
    state.close()
    return body


def play_nccl(stop: threading.Event) -> None:
    """This rank's "NCCL", calling both of autotune-nccl's plugins through their C ABI as NCCL
    2.30 does: an all-reduce of 1 MiB every 20 ms, NCCL's own choice (tree/LL: 200 us of kernel)
    and, every other one, steered by the tuner to ring/LL128 (100 us)."""
    from autotune_nccl import Tuner
    from autotune_nccl.played.profiler import ProfiledComm
    from autotune_nccl.played.tuner import NcclComm, cheapest, v6

    tuner = Tuner()
    comm, profiled = NcclComm(v6(), comm_id=0xDA5, ranks=2), ProfiledComm("v6", 0xDA5, nranks=2)
    calls = 0
    while not stop.wait(0.02):
        if calls % 2:
            tuner.arm("ring", "LL128")
        table, _ = comm.coll_info(1 << 20)
        algo, proto = cheapest(table)
        ns = 100_000 if (algo, proto) == ("ring", "LL128") else 200_000
        profiled.collective(
            "AllReduce", 1 << 18, timers=[(1_000, 1_000 + ns)], algo=algo.upper(),
            proto=proto.upper(),
        )  # fmt: skip
        calls += 1
    comm.close()
    profiled.finalize()


def serve_while_training(
    rank: int,
    world_size: int,
    base_port: int,
    storage: str,
    stop_file: str,
    nccl: bool = False,
    compression: tuple[str, ...] = (),
) -> int:
    """Train with the exporter on ``base_port`` + rank until ``stop_file`` appears; with
    ``nccl``, a played NCCL that loaded both plugins runs beside it (`play_nccl`); the tuner
    may try ``compression``'s wire dtypes (`Config.compression`)."""
    stop = threading.Event()
    player = threading.Thread(target=play_nccl, args=(stop,), daemon=True)
    if nccl:
        from autotune_nccl import library_path

        os.environ["NCCL_PROFILER_PLUGIN"] = library_path()  # what the exporter looks for
        player.start()
    ddp = DDP(model(), bucket_cap_mb=BUCKET_CAP_MB)
    config = autotune.Config(
        metrics_port=base_port,
        storage=storage,
        tune_warmup=0,
        tune_samples=1,
        max_pairs=6,  # locked soon: the speedup series appear once it is
        fusion_bytes=0,
        # The per-message series under test stop if it keeps the baseline and unhooks.
        unhook=False,
        # A plan won over 6 pairs is often a lucky one: its re-check would drop it and search
        # again, and the speedup series is absent while a search runs (docs/METRICS.md).
        recheck_every=0,
        compression=compression,
    )
    state = autotune.register(ddp, config)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    steps = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        # Every rank stops at the same step: rank 0 reads the file, all agree through a collective.
        done = torch.tensor([float(rank == 0 and Path(stop_file).exists())])
        torch.distributed.all_reduce(done)
        if done.item():
            break
        train_step(ddp, opt)
        steps += 1
        time.sleep(0.02)
    stop.set()
    if nccl:
        player.join()
    state.close()
    return steps


def port_taken(rank: int, world_size: int, port: int) -> dict[str, Any]:
    """Register with the metrics on ``port`` (+ local rank; 0: any free port), one of which may be
    taken, then train: what was said, what was done, and this rank's endpoint (its port, its
    body) if it serves one."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(f"{record.levelname}: {record.getMessage()}")

    handler = Keep()
    log = logging.getLogger("autotune")
    log.addHandler(handler)
    level = log.level
    log.setLevel(logging.INFO)  # as a user who asks for autotune's INFO lines
    try:
        ddp = DDP(model())
        state = autotune.register(ddp, autotune.Config(algorithm="ring", metrics_port=port))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for _ in range(3):
            train_step(ddp, opt)
        state.engine.settle(30)
        body = None
        if state.exporter is not None:
            url = f"http://127.0.0.1:{state.exporter.port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                body = r.read().decode()
        result = {
            "said": said,
            "exporter": state.exporter is not None,
            "messages": len(state.recorder.records()),
            "body": body,
            "port": None if state.exporter is None else state.exporter.port,
        }
        state.close()
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return result


def exporter_error(rank: int, world_size: int, settings: dict[str, Any]) -> None:
    """Register with exporter ``settings``; raises where they cannot work on this rank."""
    state = autotune.register(DDP(model()), autotune.Config(algorithm="ring", **settings))
    state.close()


__all__ = ["exporter_error", "exposition", "port_taken", "serve_while_training"]
