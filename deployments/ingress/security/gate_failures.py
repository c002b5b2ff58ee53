"""What the moderation gate does when its classifier fails, per direction
(security.moderation_gate.on_classifier_failure): fail_closed refuses with a 503
ModerationUnavailableError (shaped as the route's API shapes errors, with Retry-After; a stream
already started ends with it as an error event); fail_open lets the text through unchecked and
says so: the request's `on_skip` (the x-moderation-skipped header), the failure metric, a
warning."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, Literal

from deployments.config.security import GateFailureMode, GateFailureModes
from deployments.errors import ModerationUnavailableError

logger = logging.getLogger(__name__)

Direction = Literal["input", "output"]
# A request's note that a direction went unchecked (its answer says so).
OnSkip = Callable[[Direction], None]
# The process's count of classifier failures, by direction and mode (the metric).
OnFailure = Callable[[Direction, GateFailureMode], None]

# The response header naming the directions that went unchecked: "input", "output" or both.
SKIPPED_HEADER: Final = "x-moderation-skipped"


def skipped_header(directions: set[Direction]) -> dict[str, str]:
    """SKIPPED_HEADER for `directions`, or no header when every direction was checked."""
    if not directions:
        return {}
    return {SKIPPED_HEADER: ",".join(sorted(directions))}


class GateFailures:
    """Decides, once the classifier failed on `direction`, whether the request stops here."""

    def __init__(self, modes: GateFailureModes, on_failure: OnFailure | None = None):
        self._modes = modes
        self._on_failure = on_failure

    def mode(self, direction: Direction) -> GateFailureMode:
        return self._modes.input if direction == "input" else self._modes.output

    def handle(self, direction: Direction, error: Exception, on_skip: OnSkip | None) -> None:
        """Count and log the failure; raise ModerationUnavailableError (from `error`) when
        `direction` fails closed, else note the skip and return: the text goes unchecked."""
        mode = self.mode(direction)
        if self._on_failure is not None:
            self._on_failure(direction, mode)
        logger.warning(
            "moderation gate: the classifier failed on the %s (%s: %s); %s",
            direction,
            type(error).__name__,
            error,
            "refused" if mode == "fail_closed" else "passed unchecked",
        )
        if mode == "fail_closed":
            raise ModerationUnavailableError(
                f"the content policy could not check the {direction} now; retry later",
                retry_after_s=self._modes.retry_after_s,
            ) from error
        if on_skip is not None:
            on_skip(direction)
