"""Diagnostic ops for testing the service itself: timeouts, cancels, crashes, and a
process left holding memory."""

from app.catalog.families.creation import ENTRIES as _CREATION
from app.catalog.model import OpEntry, Param

_plan = _CREATION[0].plan_fn

ENTRIES = (
    OpEntry(
        name="sleep",
        summary="diagnostic: hold the shape's tensor and sleep (tests timeouts and cancel)",
        plan_fn=_plan,
        params=(
            Param("seconds", "float", "how long to sleep", default=1.0, minimum=0, maximum=3600),
        ),
        tags=("diagnostic",),
    ),
    OpEntry(
        name="abort",
        summary="diagnostic: the child process aborts (tests crash handling)",
        plan_fn=_plan,
        tags=("diagnostic",),
    ),
    OpEntry(
        name="leak",
        summary="diagnostic: make the shape's tensor and keep it alive in the process after "
        "the experiment (tests that a shared process left holding memory is retired)",
        plan_fn=_plan,
        tags=("diagnostic",),
    ),
)
