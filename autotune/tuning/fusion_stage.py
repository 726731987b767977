"""The plan search's fusion sizes: each meets the classes' winner after the class tests, carrying
its choices to the classes it fuses, and one that came close meets it again with screening's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from autotune.plan import Arm, Choice, Gain, NearMiss, size_class

__all__ = ["FUSION_AGAIN_BELOW", "FusionStage"]

_log = logging.getLogger("autotune")

#: A fusion size that lost its paired test is met again with screening's algorithms
#: (`FusionStage.again`) if its median ratio was below this and it was not slower beyond
#: noise: where fusing is within noise of the incumbent, being behind or ahead on the median is
#: a coin's toss, while with screening's algorithm on classes the incumbent runs natively the
#: fused plan may gain most (docs/TUNER.md, "Fusion sizes met again").
FUSION_AGAIN_BELOW = 1.1


class FusionStage:
    """One round's fusion sizes, for `autotune.tuning.plan_search.PlanSearch`: those still to meet
    the incumbent (``pending``), the plan each makes of it (`plan`; `next` skips one that makes
    the same messages as the incumbent or a size met already), and the one that lost but came
    close (``near``), met once more (`again`).

    ``messages(fusion)`` gives the message sizes a fusion size makes of the job's buckets now
    (empty: not known yet; `autotune.ddp.messages.message_sizes`), ``space(cls)`` the choices a
    size class can run (None: any)."""

    def __init__(
        self,
        options: Sequence[int],
        messages: Callable[[int], list[int]],
        space: Callable[[int], Sequence[Choice]] | None = None,
    ) -> None:
        self.options = list(options)
        self.messages = messages
        self.space = space
        self.pending: list[int] = []
        #: Whether this round's fusion sizes have all met the incumbent (or none is tuned).
        self.done = True
        #: This round's fusion size that lost but came close (`close`), the closest: it meets the
        #: incumbent once more (`again`); a job that ends first stores it.
        self.near: NearMiss | None = None
        self._met: list[int] = []  # the fusion sizes that met the incumbent this round
        self._meeting: list[int] = []  # the fusion sizes whose first meeting is under way
        self._again = False  # the paired test under way is the near miss's second meeting

    def open(self, sizes: Sequence[int] | None = None) -> None:
        """A new round: every fusion size is to meet the incumbent, or those of ``sizes``."""
        self.pending = [f for f in self.options if sizes is None or f in sizes]
        self.done = not self.pending
        self.near, self._met, self._meeting, self._again = None, [], [], False

    @property
    def left(self) -> list[int]:
        """The fusion sizes that have not met the incumbent yet, the one meeting it included:
        what a job that ends now leaves the next (`autotune.tuning.stored.provisional`)."""
        return self._meeting + self.pending

    def next(self, incumbent: Arm) -> Arm | None:
        """The next fusion size's plan to meet ``incumbent`` (`plan`, with its choices); None
        once all have met it."""
        while self.pending:
            fusion = self.pending.pop(0)
            challenger = self.plan(incumbent, fusion, incumbent.as_dict())
            if challenger != incumbent and self._meets(incumbent, challenger):
                self._meeting.append(fusion)
                return challenger
        return None

    def plan(self, incumbent: Arm, fusion: int, source: Mapping[int, Choice]) -> Arm:
        """``incumbent`` at ``fusion``: each class its messages make that the incumbent's do not
        takes the choice of the nearest class by size in ``source`` (none there: the
        baseline's), so that a fused plan meets the classes' winner with the algorithms that
        won, not on the baseline's all-reduce alone (docs/TUNER.md, "The fusion sizes after
        the classes")."""
        now = {size_class(n) for n in self.messages(incumbent.fusion_bytes)}
        new = {size_class(n) for n in self.messages(fusion)} - now
        carried = {}
        for cls in new if source else ():
            near = source[min(source, key=lambda c: (abs(c.bit_length() - cls.bit_length()), -c))]
            fit = self._fit(cls, near)
            if fit is not None:
                carried[cls] = fit
        return Arm.of({**incumbent.as_dict(), **carried}, fusion)

    def _fit(self, cls: int, choice: Choice) -> Choice | None:
        """``choice`` as size class ``cls`` can run it: itself, else its algorithm unsegmented
        (or at its largest segment) where a segment is no smaller than the class; None where the
        class cannot run the algorithm (it keeps the baseline's)."""
        if self.space is None:
            return choice
        space = self.space(cls)
        if choice in space:
            return choice
        same = [c for c in space if (c.algorithm, c.wire) == (choice.algorithm, choice.wire)]
        return max(same, key=lambda c: c.span, default=None)

    def _meets(self, incumbent: Arm, challenger: Arm) -> bool:
        """Whether ``challenger`` (a fusion size's plan) meets ``incumbent``: not where it runs
        the messages of the incumbent, or of a fusion size that met it this round (it would
        test the same plan again)."""
        fusion = challenger.fusion_bytes
        made = self.messages(fusion) if fusion != incumbent.fusion_bytes else []
        for other in (incumbent.fusion_bytes, *self._met):
            if made and self.messages(other) == made:
                _log.info(
                    "autotune skips %s: it makes the same %d messages as %s",
                    challenger.describe(),
                    len(made),
                    incumbent.with_fusion(other).describe(),
                )
                return False
        self._met.append(fusion)
        return True

    def again(self, incumbent: Arm, screened: Mapping[int, Choice]) -> Arm | None:
        """Once every fusion size has met the incumbent: the near miss's plan with screening's
        choices (``screened``, per class its fastest; the incumbent's own where it has one), to
        meet the incumbent once more; None where there is none, or it would be a plan met
        already. Where no class's choice won, a fusion size met the incumbent on the baseline's
        all-reduce, where fewer, larger messages may gain too little to prove, and with
        screening's algorithm gain most (docs/TUNER.md, "Fusion sizes met again")."""
        near = self.near
        self.done = True
        if near is None or near.arm.fusion_bytes == incumbent.fusion_bytes:
            self.near = None
            return None
        fusion = near.arm.fusion_bytes
        challenger = self.plan(incumbent, fusion, {**screened, **incumbent.as_dict()})
        made = {size_class(n) for n in self.messages(fusion)}
        if all(challenger.choice(c) == near.arm.choice(c) for c in made):
            self.near = None  # nothing to carry, or its messages run as they lost: not again
            return None
        _log.info(
            "autotune tries %s again, with algorithms: %s",
            incumbent.with_fusion(fusion).describe(),
            challenger.describe(),
        )
        self._again = True
        return challenger

    def ended(self, challenger: Arm, won: bool, gain: Gain) -> None:
        """A fusion size's paired test ended: its second meeting forgets the near miss; a first
        that lost and came close (`close`) is the near miss, if the closest. One that won is
        still meeting until the meeting is over (`settle`): a job that ends first leaves it to
        the next."""
        if not won and challenger.fusion_bytes in self._meeting:
            self._meeting.remove(challenger.fusion_bytes)
        if self._again:
            self._again, self.near = False, None
        elif not won and close(gain) and (self.near is None or gain.ratio < self.near.gain.ratio):
            self.near = NearMiss(challenger, gain)

    def settle(self, won: Sequence[int]) -> None:
        """The meeting is over. Of its sizes that won (``won``, the fastest on the median
        first), the first is the incumbent now; each other meets it next (`next`), with its
        choices, as it would have had it met the sizes one at a time."""
        self._meeting = []
        for fusion in reversed(won[1:]):
            self._met.remove(fusion)
            self.pending.insert(0, fusion)


def close(gain: Gain) -> bool:
    """Whether a fusion size that lost came close enough to meet the incumbent again with
    screening's algorithms (`FusionStage.again`): not slower beyond noise, its median under
    `FUSION_AGAIN_BELOW`."""
    return gain.ratio < FUSION_AGAIN_BELOW and gain.low <= 1.0
