"""The policy of supervised background loops (see "Supervised loops" in docs/architecture.md):
when a failed loop runs again, and when it counts as failing; no I/O."""

from __future__ import annotations

from collections.abc import Mapping

#: The pause before a loop runs again after a failed round, doubling with each failure in a row
#: up to the cap (a loop's own interval applies when longer).
RESTART_FIRST = 0.1
RESTART_CAP = 5.0
#: Failed rounds in a row after which a loop counts as failing: the node reports itself unready
#: (`/readyz`) until one of its rounds succeeds again.
FAILING_AFTER = 3


def next_pause(interval: float, failures: int) -> float:
    """Seconds until a loop's next round: its `interval`, or after `failures` failed rounds in a
    row (0: the last round succeeded) the backoff, when that is longer."""
    if failures <= 0:
        return interval
    backoff: float = RESTART_FIRST * 2.0 ** (failures - 1)
    return max(interval, min(backoff, RESTART_CAP))


class LoopHealth:
    """The failures in a row of each loop, and the loops failing now with their reasons."""

    def __init__(self) -> None:
        self._failures: dict[str, int] = {}
        self._failing: dict[str, str] = {}

    def failed(self, loop: str, error: BaseException) -> int:
        """A round of `loop` raised `error`; how many rounds in a row have failed."""
        failures = self._failures.get(loop, 0) + 1
        self._failures[loop] = failures
        if failures >= FAILING_AFTER:
            last = f"{type(error).__name__}: {error}"
            self._failing[loop] = f"{failures} rounds failed in a row, the last with {last}"
        return failures

    def succeeded(self, loop: str) -> None:
        """A round of `loop` ran through: it is healthy again."""
        self._failures.pop(loop, None)
        self._failing.pop(loop, None)

    def stopped(self, loop: str, error: BaseException | None) -> None:
        """`loop` ended while the router was not stopping (it will not run again)."""
        why = "" if error is None else f" with {type(error).__name__}: {error}"
        self._failing[loop] = f"stopped{why}"

    @property
    def failing(self) -> Mapping[str, str]:
        """Loop name -> why it counts as failing (empty: every loop is healthy)."""
        return dict(self._failing)
