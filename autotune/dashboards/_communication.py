"""The Communication dashboard: each all-reduce's cost, the plan, what the tuner does."""

from __future__ import annotations

from typing import Any

from autotune.dashboards._sdk import Sdk

__all__ = ["UID", "communication"]

UID = "autotune-communication"
_SEL = 'job=~"$job", instance=~"$instance", rank=~"$rank"'
_RATE = "[$__rate_interval]"


def _quantile(q: float, series: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({series}_bucket{{{_SEL}}}{_RATE})))"


def communication(s: Sdk) -> Any:
    latency = "autotune_allreduce_latency_seconds"
    d = (
        s.new_dashboard(
            "autotune / Communication",
            UID,
            "All-reduce latency and bus bandwidth per message-size class and algorithm, the "
            "plan, the tuner's progress, and how much communication backward does not hide.",
        )
        .with_variable(s.datasource_variable())
        .with_variable(s.label_variable("job", "label_values(autotune_allreduce_bytes_total, job)"))
        .with_variable(
            s.label_variable(
                "instance", 'label_values(autotune_allreduce_bytes_total{job=~"$job"}, instance)'
            )
        )
        .with_variable(
            s.label_variable(
                "rank",
                'label_values(autotune_allreduce_bytes_total{job=~"$job", instance=~"$instance"}, '
                "rank)",
            )
        )
    )
    d = d.with_row(s.row("All-reduce"))
    for q, what in ((0.5, "p50"), (0.99, "p99")):
        d = d.with_panel(
            s.timeseries_panel(
                f"Latency {what} by size class",
                f"The {what} time of one all-reduce, per message-size class (class c holds "
                "messages of (c/2, c] bytes), over the selected ranks.",
                "s",
                [s.query(_quantile(q, latency, "size_class"), "{{size_class}} B")],
                width=8,
            )
        )
    d = d.with_panel(
        s.heatmap_panel(
            "Latency heatmap",
            "How many all-reduces took how long, over time (every size class and rank).",
            "s",
            s.query(
                f"sum by (le) (increase({latency}_bucket{{{_SEL}}}{_RATE}))",
                "{{le}}",
                heatmap=True,
            ),
            width=8,
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "Bus bandwidth by algorithm",
            "busbw = algbw * 2(n-1)/n, as nccl-tests reports it: median of each rank's last 16 "
            "messages, averaged over ranks, per algorithm and size class.",
            "Bps",
            [
                s.query(
                    "avg by (algorithm, size_class) "
                    f"(autotune_allreduce_busbw_bytes_per_second{{{_SEL}}})",
                    "{{algorithm}}, {{size_class}} B",
                )
            ],
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "All-reduced bytes per second by algorithm",
            "Message bytes all-reduced per second, summed over the selected ranks.",
            "Bps",
            [
                s.query(
                    f"sum by (algorithm) (rate(autotune_allreduce_bytes_total{{{_SEL}}}{_RATE}))",
                    "{{algorithm}}",
                )
            ],
        )
    )
    d = d.with_row(s.row("Plan and tuner"))
    d = d.with_panel(
        s.timeseries_panel(
            "Step time against plain DDP",
            "autotune's training step over plain DDP's (below 1: faster), from paired "
            "iterations or blocks: the median and its 95% interval; 1 while it keeps the "
            "baseline. Provisional until 'Decision' reads final.",
            "none",
            [
                s.query(
                    f'max by (bound) (autotune_step_ratio{{{_SEL}, bound="{b}"}})',
                    b,
                    ref=ref,
                )
                for b, ref in (("estimate", "A"), ("low", "B"), ("high", "C"))
            ],
            width=10,
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "Compression error by size class",
            "Where the job allows compression (Config.compression): the relative error the "
            "cast to the wire dtype adds to a rank's gradients, ||g - cast(g)|| / ||g||, "
            "sampled; judge it beside the step time. No series without compression.",
            "percentunit",
            [
                s.query(
                    f"max by (size_class, wire) (autotune_compression_relative_error{{{_SEL}}})",
                    "{{size_class}} B {{wire}}",
                )
            ],
            width=8,
        )
    )
    d = d.with_panel(
        s.stat_panel(
            "Paired measurements behind the ratio",
            "Pairs of iterations (or blocks) the step ratio rests on; 0 while the baseline "
            "is kept.",
            "none",
            [s.query(f"max(autotune_step_ratio_pairs{{{_SEL}}})", "pairs")],
            width=3,
            height=8,
        )
    )
    d = d.with_panel(
        s.stat_panel(
            "Decision",
            "1: final (the plan locked, its checks over); 0: provisional, with the iterations "
            "the stages known now still take, as estimated.",
            "none",
            [
                s.query(f"min(autotune_step_ratio_final{{{_SEL}}})", "final", ref="A"),
                s.query(f"max(autotune_tuner_iterations_left{{{_SEL}}})", "left", ref="B"),
            ],
            width=3,
            height=8,
        )
    )
    d = d.with_panel(
        s.table_panel(
            "Plan per size class",
            "The algorithm and pipeline segment each size class runs now (segment 0: the "
            "algorithm's default).",
            s.query(
                f"max by (size_class, algorithm, segment_bytes) (autotune_plan_info{{{_SEL}}})",
                instant=True,
            ),
            width=8,
        )
    )
    d = d.with_panel(
        s.state_panel(
            "Tuner state by size class",
            "Exploring: the tuner is screening or comparing plans. Locked: it runs the plan "
            "that beat the baseline on the step (or the baseline), re-checking it now and then.",
            s.query(
                f'max by (size_class) (autotune_tuner_state{{{_SEL}, state="locked"}})',
                "{{size_class}} B",
            ),
            {"0": ("exploring", "orange"), "1": ("locked", "green")},
            width=8,
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "Tuner trials by size class",
            "Trials the tuner has run in this job, per size class and for the fusion size "
            "(rank 0 owns the studies).",
            "short",
            [
                s.query(
                    f"sum by (size_class) (autotune_tuner_trials_total{{{_SEL}}})",
                    "{{size_class}}",
                )
            ],
            width=8,
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "Best trial latency by size class",
            "The tuner's best screening latency so far per size class (what a message costs once "
            "every rank is there: the least over ranks).",
            "s",
            [
                s.query(
                    f"max by (size_class) (autotune_tuner_best_latency_seconds{{{_SEL}}})",
                    "{{size_class}}",
                )
            ],
            width=12,
        )
    )
    d = d.with_panel(
        s.stat_panel(
            "Settled",
            "1 once every size class and the fusion size are locked (on every selected rank).",
            "none",
            [s.query(f"min(autotune_tuner_settled{{{_SEL}}})", "settled")],
        )
    )
    d = d.with_panel(
        s.stat_panel(
            "Fusion size",
            "The message size buckets are fused or split to (0: DDP's buckets as they are).",
            "bytes",
            [s.query(f"max(autotune_fusion_bytes{{{_SEL}}})", "fusion")],
        )
    )
    d = d.with_panel(
        s.stat_panel(
            "Ranks without metrics",
            "The job's ranks that serve no metrics endpoint (their port was in use): they train "
            "on, and no panel here sees them. 0 when every rank is scraped.",
            "none",
            [s.query(f'max(autotune_metrics_endpoints{{{_SEL},state="none"}})', "unscraped")],
        )
    )
    d = d.with_row(s.row("Overlap and stragglers"))
    exposed = "autotune_exposed_communication_seconds"
    blocked = "autotune_peer_wait_seconds"
    d = d.with_panel(
        s.timeseries_panel(
            "Exposed communication per iteration",
            "From backward's last bucket to its last message done: the communication backward "
            "did not hide, per rank (p50 and p90); and the mean time a message kept the rank "
            "blocked on its peers. Exposed time that is mostly blocked is the ranks' skew "
            "(a slower rank's backward), not the all-reduce's own work.",
            "s",
            [
                s.query(_quantile(0.5, exposed, "rank"), "rank {{rank}} p50"),
                s.query(_quantile(0.9, exposed, "rank"), "rank {{rank}} p90", ref="B"),
                s.query(
                    f"sum by (rank) (rate({blocked}_sum{{{_SEL}}}{_RATE})) / "
                    f"sum by (rank) (rate({blocked}_count{{{_SEL}}}{_RATE}))",
                    "rank {{rank}} blocked on peers, per message",
                    ref="C",
                ),
            ],
            width=8,
        )
    )
    wait = "autotune_first_peer_wait_seconds"
    d = d.with_panel(
        s.timeseries_panel(
            "Straggler wait by rank",
            "Mean time a message waited for its first peer's data. The others wait for a "
            "straggler, so the rank that waits least is the one holding the job back.",
            "s",
            [
                s.query(
                    f"sum by (rank) (rate({wait}_sum{{{_SEL}}}{_RATE})) / "
                    f"sum by (rank) (rate({wait}_count{{{_SEL}}}{_RATE}))",
                    "rank {{rank}}",
                )
            ],
            width=8,
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "Bytes on the wire by rank",
            "What each rank sent for the point-to-point algorithms (native's traffic is the "
            "backend's and is not seen).",
            "Bps",
            [
                s.query(
                    f"sum by (rank) (rate(autotune_p2p_sent_bytes_total{{{_SEL}}}{_RATE}))",
                    "rank {{rank}}",
                )
            ],
            width=8,
        )
    )
    d = _nccl_row(s, d)
    return d


def _nccl_row(s: Sdk, d: Any) -> Any:
    """NCCL's own collectives, on NCCL's clock: series from autotune's NCCL profiler plugin
    (docs/NCCL_PROFILER.md), served by the rank's exporter or by ``autotune daemon``."""
    seconds = "autotune_nccl_collective_seconds"
    d = d.with_row(s.row("NCCL's collectives (profiler plugin)"))
    d = d.with_panel(
        s.timeseries_panel(
            "NCCL kernel time p50 by collective and size class",
            "The median kernel time of NCCL's collectives (first channel start to last channel "
            "stop, NCCL's GPU timer), every collective of the job, with or without the hook.",
            "s",
            [
                s.query(
                    _quantile(0.5, seconds, "collective, size_class"),
                    "{{collective}} {{size_class}} B",
                )
            ],
            width=8,
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "NCCL collectives per second by algorithm and protocol",
            "What NCCL chose (or was steered to) for its collectives: calls per second, summed "
            "over the selected ranks.",
            "ops",
            [
                s.query(
                    "sum by (collective, algorithm, protocol) "
                    f"(rate({seconds}_count{{{_SEL}}}{_RATE}))",
                    "{{collective}} {{algorithm}}/{{protocol}}",
                )
            ],
            width=8,
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "NCCL bus bandwidth by collective, algorithm and protocol",
            "busbw of NCCL's collectives over the run (nccl-tests' factors), averaged over "
            "ranks, per collective, size class and NCCL cell.",
            "Bps",
            [
                s.query(
                    "avg by (collective, size_class, algorithm, protocol) "
                    f"(autotune_nccl_busbw_bytes_per_second{{{_SEL}}})",
                    "{{collective}} {{size_class}} B {{algorithm}}/{{protocol}}",
                )
            ],
            width=8,
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "NCCL model error by cell",
            "NCCL's predicted time (its tuner cost table) over the measured kernel time: 1 is "
            "exact, 0.5 means the kernel took twice what NCCL expected. Needs the tuner plugin.",
            "none",
            [
                s.query(
                    "avg by (collective, size_class, algorithm, protocol) "
                    f"(autotune_nccl_model_error_ratio{{{_SEL}}})",
                    "{{collective}} {{size_class}} B {{algorithm}}/{{protocol}}",
                )
            ],
        )
    )
    d = d.with_panel(
        s.timeseries_panel(
            "Regret of NCCL's own choice",
            "Median time of the cell NCCL's model picks over the best cell measured, per "
            "collective and size class, where both ran (the tuner screens several): 1 means "
            "NCCL chose the best one measured.",
            "none",
            [
                s.query(
                    "max by (collective, size_class, nccl_choice, best) "
                    f"(autotune_nccl_choice_regret_ratio{{{_SEL}}})",
                    "{{collective}} {{size_class}} B: {{nccl_choice}} vs {{best}}",
                )
            ],
        )
    )
    return d
