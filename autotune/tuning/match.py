"""A paired test under way in the plan search: the reference against one challenger, or against
two at once that share its iterations.

With one challenger the order is the paired test's own, A B B A (`PairedTest.schedule`). With
two (the fusion sizes: docs/TUNER.md, "Two fusion sizes at once") it is B1 A B2, B2 A B1,
repeated: each reference iteration is the neighbour of one iteration of each challenger, so it
completes a pair of each test, and each challenger is paired before and after the reference by
turns, as in A B B A. Two tests of n pairs then take 3n iterations instead of 4n, and a pair's
ratio is still a step over its neighbour's. Once one test has ended, the other goes on alone in
its own order, first completing the pair it had half measured.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from autotune.plan import Arm
from autotune.tuning.paired_test import Outcome, PairedTest

__all__ = ["Match", "Rival"]

_log = logging.getLogger("autotune")


@dataclass
class Rival:
    """A challenger and its paired test against the match's reference."""

    challenger: Arm
    duel: PairedTest


class Match:
    """``reference`` (A) against each of ``rivals`` (one or two), a paired test each; ``kind``:
    what the plan search calls it ("fusion", "joint", "class", "combined", "confirm", "retry" or
    "recheck")."""

    def __init__(self, reference: Arm, rivals: list[Rival], kind: str) -> None:
        if not 1 <= len(rivals) <= 2:
            raise ValueError(f"a match has one or two challengers, not {len(rivals)}")
        self.reference = reference
        self.rivals = rivals
        self.kind = kind
        #: The challengers whose test has ended, with how, in the order they ended.
        self.ended: list[tuple[Arm, Outcome]] = []
        self._turn = 0  # the next iteration's place in the order of two challengers

    @property
    def challenger(self) -> Arm:
        """The first challenger still under test."""
        return self.rivals[0].challenger

    @property
    def duel(self) -> PairedTest:
        """The first challenger's paired test."""
        return self.rivals[0].duel

    def next_arm(self) -> Arm:
        """The plan the next scheduled iteration runs."""
        if len(self.rivals) == 1:
            return self.challenger if self.duel.schedule() else self.reference
        first, second = (r.challenger for r in self.rivals)
        order = (first, self.reference, second, second, self.reference, first)
        arm = order[self._turn % len(order)]
        self._turn += 1
        return arm

    def measure(self, arm: Arm, step_s: float) -> list[tuple[Arm, Outcome]]:
        """One iteration's step (MAX over ranks) under ``arm``: the reference's goes to every
        test, a challenger's to its own (an arm of neither is one from before the match). The
        challengers whose test it ended, with how; they leave the match."""
        ended = []
        for rival in list(self.rivals):
            if arm == self.reference:
                outcome = rival.duel.measure(False, step_s)
            elif arm == rival.challenger:
                outcome = rival.duel.measure(True, step_s)
            else:
                continue
            if outcome is not None:
                self.rivals.remove(rival)
                ended.append((rival.challenger, outcome))
        if ended and len(self.rivals) == 1:
            self.duel.follow_on()  # alone now, in its own order
        self.ended += ended
        return ended

    @property
    def over(self) -> bool:
        """Whether every challenger's test has ended (`ended` holds them all)."""
        return not self.rivals

    def measurements_left(self) -> int:
        """Iterations to every test's ``max_pairs`` (`PairedTest.measurements_left`), roughly:
        while two go on, a pair of each takes three iterations, not four."""
        left = sorted(r.duel.measurements_left() for r in self.rivals)
        return left[-1] + left[0] // 2 if len(left) == 2 else sum(left)

    def report(self, challenger: Arm, outcome: Outcome) -> None:
        """Log how ``challenger``'s test ended (a fusion size met again says so after it)."""
        g = outcome.gain
        _log.info(
            "autotune %s paired test: %s %s, %.3fx the reference's step (%d pairs, 95%% "
            "interval %.3f-%.3f): %s",
            self.kind,
            challenger.describe(),
            outcome.word(self.kind),
            g.ratio,
            g.pairs,
            g.low,
            g.high,
            outcome.why,
        )
