"""Jobs for the unhooking tests: autotune's hooked model beside plain DDP, on spawned ranks."""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from ddp_jobs import VARIANTS, Net, digest
from torch.nn.parallel import DistributedDataParallel as DDP

import autotune
from autotune.storage import Store
from autotune.testing import played_nccl
from autotune.testing.settled import everywhere

#: A tuner that can only keep the baseline: one candidate (native), DDP's buckets, quick trials.
KEEPS_BASELINE = {"algorithms": ("native",), "fusion_bytes": 0, "tune_warmup": 0, "tune_samples": 1}
#: Seconds ``slow`` adds to a step: several times the small model's step on 2 shared cores.
SLOW_S = 0.02


@dataclass
class Aside:
    aside_at: int | None  # the iteration after which autotune unhooked (None: it did not)
    refused: str | None  # why it could not, if it could not
    calls: list[int]  # hook calls in each step
    synced: list[bool]  # whether each step all-reduced (not under no_sync)
    hooked: str  # digest of the hooked model's parameters
    plain: str  # digest of plain DDP's, trained beside it on the same batches
    plain_rel: float  # largest relative distance from plain DDP's, per parameter
    reducer_replaced: bool
    hooks_left: int  # what DDP's _comm_hooks lists at the end
    # state.aside, the deprecated name of state.unhooking: (the same object, warned)
    old_name: tuple[bool, bool]
    verdict: str
    # The exporter's autotune_hook_unhooked and, for a release, its old name, if it ran.
    unhooked_gauge: float | None
    stepped_aside_gauge: float | None
    # DDP's bucket size once unhooked (`autotune.tuning.buckets`): each challenger's cap and
    # whether it won, the cap kept (None: not searched), the model's cap at the end, the stored
    # table's.
    bucket_duels: list[tuple[int, bool]] | None = None
    bucket_kept: int | None = None
    bucket_cap: int = 0
    stored_buckets: dict[str, Any] | None = None
    # The check against plain DDP (`autotune.tuning.plain_check`): whether the hook ran on after it
    # (None: none ran), its pairs of blocks, and the plan the storage holds afterwards (algorithm
    # per size class).
    catch_kept: bool | None = None
    catch_pairs: int = 0
    stored_plan: dict[int, str] | None = None
    # `state.status().headline` after each step (`autotune.tuning.status.Status`).
    headlines: list[str] = field(default_factory=list)
    # `state.plan()` at the end: the algorithm per size class the job names.
    plan: dict[int, str] = field(default_factory=dict)


def beside_plain(
    rank: int,
    world_size: int,
    variant_name: str,
    steps: int,
    how: str,
    config: dict[str, Any],
    break_rebuild: str | None = None,
    after_aside: int | None = None,
    slow: str | None = None,
    after_catch: int | None = None,
) -> Aside:
    """Train autotune's model (registered by ``how``: "register" or "one_line", the state not
    told its model) and plain DDP on the same batches, as `ddp_jobs.train_pair` does.
    ``break_rebuild``: "missing" hides a method the rebuild needs, as an older torch would lack
    it; "raises" makes the reducer's build fail after the new reducer exists. With
    ``after_aside``, ``steps`` is a cap: training stops once every rank has unhooked and
    taken that many synced steps since (how soon the tuner locks depends on the machine's
    load), and has finished tuning DDP's bucket size where it does. ``slow``: "reference" slows
    every step of the hooked model while its reducer has the buckets the job built it with (by
    `SLOW_S`), "others" while it has any other bucket size; "hook" while the reducer has
    autotune's hook, "plain" while it has none (`autotune.tuning.plain_check`). With
    ``after_catch``, ``steps`` is a cap: training stops once every rank's catch is over and it has
    taken that many synced steps since."""
    variant = VARIANTS[variant_name]
    torch.manual_seed(0)
    base = Net()
    models = [DDP(copy.deepcopy(base), **variant.ddp) for _ in range(2)]
    from torch.nn.parallel import distributed

    if break_rebuild == "missing":
        del distributed.DistributedDataParallel._build_debug_param_to_name_mapping
    elif break_rebuild == "raises":
        helper: Callable[..., None] = distributed.DistributedDataParallel._ddp_init_helper

        def failing(self: DDP, *args: Any) -> None:
            helper(self, *args)
            raise RuntimeError("injected: the reducer's logger failed")

        distributed.DistributedDataParallel._ddp_init_helper = failing  # type: ignore[method-assign]
    if slow is not None:
        built = models[0].bucket_bytes_cap

        def delay(module: DDP, args: object) -> None:
            if slow in ("hook", "plain"):
                hooked = bool(module._comm_hooks)
                if hooked == (slow == "hook"):
                    time.sleep(SLOW_S)
            elif (module.bucket_bytes_cap == built) == (slow == "reference"):
                time.sleep(SLOW_S)

        models[0].register_forward_pre_hook(delay)
    cfg = autotune.Config(timeout_s=60, **config)
    if how == "register":
        state = autotune.register(models[0], cfg)
    else:
        state = autotune.AutotuneState(config=cfg)
        models[0].register_comm_hook(state, autotune.hook)
    first_reducer = models[0].reducer
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    g = torch.Generator().manual_seed(100 + rank)
    calls: list[int] = []
    synced: list[bool] = []
    headlines: list[str] = []
    caught_at: int | None = None  # synced steps when this rank's catch was over
    for step in range(steps):
        if after_aside is not None and _all_done(state, synced, after_aside):
            break
        if after_catch is not None:
            if caught_at is None and _catch_over(state):
                caught_at = sum(synced)
            if everywhere(caught_at is not None and sum(synced) >= caught_at + after_catch):
                break
        before = len(state.recorder.hook_calls())
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        use_branch = not (variant.skip_branch and step % 2)
        accumulate = variant.no_sync_every and step % (variant.no_sync_every + 1) != 0
        for model, opt in zip(models, optimizers, strict=True):
            if accumulate:
                with model.no_sync():
                    torch.nn.functional.cross_entropy(model(x, use_branch), y).backward()
                continue
            torch.nn.functional.cross_entropy(model(x, use_branch), y).backward()
            opt.step()
            opt.zero_grad()
        calls.append(len(state.recorder.hook_calls()) - before)
        synced.append(not accumulate)
        headlines.append(state.status().headline)
    played_nccl.final_check()  # on the played NCCL: one order of launches everywhere
    unhooking = state.unhooking
    search = None if unhooking is None or unhooking.buckets is None else unhooking.buckets.search
    rel = max(
        float((a.double() - b.double()).norm() / b.double().norm())
        for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True)
    )
    result = Aside(
        aside_at=None if unhooking is None else unhooking.at,
        refused=None if unhooking is None else unhooking.refused,
        calls=calls,
        synced=synced,
        hooked=digest(list(models[0].parameters())),
        plain=digest(list(models[1].parameters())),
        plain_rel=rel,
        reducer_replaced=models[0].reducer is not first_reducer,
        hooks_left=len(models[0]._comm_hooks),
        old_name=_old_name(state),
        verdict=state.verdict(),
        unhooked_gauge=None
        if state.exporter is None
        else state.exporter.registry.get_sample_value(
            "autotune_hook_unhooked", {"rank": str(rank), "local_rank": str(rank)}
        ),
        stepped_aside_gauge=None
        if state.exporter is None
        else state.exporter.registry.get_sample_value(
            "autotune_hook_stepped_aside", {"rank": str(rank), "local_rank": str(rank)}
        ),
        bucket_duels=None
        if search is None
        else [(cap, o.challenger_won) for cap, o in search.history],
        bucket_kept=None if search is None else search.kept,
        bucket_cap=models[0].bucket_bytes_cap,
        headlines=headlines,
        plan={cls: c.algorithm for cls, c in state.plan().items()},
    )
    catch = None if unhooking is None else unhooking.catch
    if catch is not None:
        result.catch_kept = catch.hooked
        result.catch_pairs = 0 if catch.outcome is None else catch.outcome.gain.pairs
    state.close()  # after the tuner's worker has written the table
    if rank == 0 and "storage" in config:
        result.stored_buckets = _stored_buckets(config)
        table = Store(str(config["storage"])).tables()
        if len(table) == 1:
            (stored,) = table.values()
            result.stored_plan = {c: e.choice.algorithm for c, e in stored.classes.items()}
    return result


def _catch_over(state: autotune.AutotuneState) -> bool:
    """Whether this rank's catch (`autotune.tuning.plain_check`) has decided."""
    unhooking = state.unhooking
    return (
        unhooking is not None
        and unhooking.catch is not None
        and unhooking.catch.outcome is not None
    )


def _all_done(state: autotune.AutotuneState, synced: list[bool], after_aside: int) -> bool:
    """Whether every rank unhooked ``after_aside`` synced steps ago or more, and has
    decided DDP's bucket size where it tunes it (agreed)."""
    unhooking = state.unhooking
    at = None if unhooking is None else unhooking.at
    tuner = None if unhooking is None else unhooking.buckets
    decided = tuner is None or tuner.done
    return everywhere(at is not None and decided and sum(synced) >= at + after_aside)


def _stored_buckets(config: dict[str, Any]) -> dict[str, Any] | None:
    """The bucket size the job's storage holds for its one fingerprint, as JSON."""
    tables = list(Store(str(config["storage"])).tables().values())
    if len(tables) != 1 or tables[0].buckets is None:
        return None
    stored: dict[str, Any] = tables[0].buckets.to_json()
    return stored


def _old_name(state: Any) -> tuple[bool, bool]:
    """Whether ``state.aside`` is ``state.unhooking``, and said it is deprecated."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        same = state.aside is state.unhooking
    return same, any(issubclass(w.category, DeprecationWarning) for w in caught)
