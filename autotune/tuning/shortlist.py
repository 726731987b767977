"""Which of a class's screened choices meet the plan it runs on the step (`shortlist`).

Screening measures each choice's message latency (`autotune.tuning.search`); a latency only
puts a choice forward. Whether it runs is decided on the training step, by a paired test
against the plan (`autotune.tuning.plan_search`).
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.plan import Choice

__all__ = ["RUNNER_UP_WITHIN", "SHORTLIST_BELOW", "shortlist"]

#: A class's latency-best choice is shortlisted only below this fraction of the current latency:
#: a paired test costs tens of steps, and a 3% faster message rarely shows in the step.
SHORTLIST_BELOW = 0.9
#: The fastest other algorithm is shortlisted too when its latency is within this factor of the
#: fastest choice's. A screening value is the median of a few windows measured inside a busy
#: step, and on a shared machine two algorithms 5-10% apart trade places from run to run: the
#: one faster on the step may screen second and, without this, never be tried. A second paired
#: test costs tens of steps; locking the wrong one of two close choices costs every step after.
RUNNER_UP_WITHIN = 1.1


def shortlist(values: Mapping[Choice, float], now: Choice) -> list[tuple[Choice, float]]:
    """A class's challengers from its screening: (choice, latency it saves against ``now``).

    ``values`` holds each measured choice's latency, ``now`` what the class runs. The fastest
    choice is shortlisted if it is below `SHORTLIST_BELOW` of ``now``'s latency (or ``now`` was
    not measured); the fastest choice of another algorithm too, if it passes the same bar and is
    within `RUNNER_UP_WITHIN` of the fastest. A segment size of the same algorithm is not a
    runner-up: the paired test would mostly re-test the algorithm. Where the job allows
    compression, the fastest of the same algorithm on another wire (`Choice.wire`) is one too,
    however far behind it screened (if it passes the first bar): the casts cost the step memory
    traffic the message's latency does not show, so the two latencies do not compare, and only
    the step tells whether the halved bytes pay.
    """
    if not values:
        return []
    ranked = sorted(values.items(), key=lambda kv: kv[1])
    best, best_s = ranked[0]
    now_s = values.get(now)
    reference = best_s if now_s is None else now_s

    def promising(choice: Choice, seconds: float) -> bool:
        return choice != now and (now_s is None or seconds < SHORTLIST_BELOW * now_s)

    if not promising(best, best_s):
        return []
    out = [(best, reference - best_s)]
    rest = ranked[1:]
    runner = next(((c, t) for c, t in rest if c.algorithm != best.algorithm), None)
    if runner is not None and runner[1] <= RUNNER_UP_WITHIN * best_s and promising(*runner):
        out.append((runner[0], reference - runner[1]))
    twin = next(
        ((c, t) for c, t in rest if c.algorithm == best.algorithm and c.wire != best.wire), None
    )
    if twin is not None and promising(*twin):
        out.append((twin[0], reference - twin[1]))
    return out
