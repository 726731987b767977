"""What a job's headlines (`Status.headline`, read after each step) must never do: claim a gain
before the decision is final, or go back to provisional without a stage that reopens it."""

from __future__ import annotations

from collections.abc import Sequence


def assert_never_claims_early(headlines: Sequence[str]) -> None:
    """Every headline is provisional (and says what is still to run) until the first final one;
    "faster" appears only in a final one."""
    for i, headline in enumerate(headlines):
        if headline.startswith("provisional: "):
            assert "faster" not in headline, (i, headline)
            assert "still to run: " in headline, (i, headline)
        else:
            assert headline.startswith(("no gain: ", "0.", "1.")), (i, headline)
