"""How a finished experiment reads against the question of the preset it was queued from:
the status line that people read first, and notes where the run does not answer that
question as it stands (a question about the GPU that ran on the CPU).

A preset whose answer is a refusal (``inplace_add_requires_grad``: autograd refuses an
in-place op on a leaf that requires grad) fails when it answers: its status stays
``failed``, and its status line says that the refusal is the answer.
"""

from dataclasses import dataclass

from app.catalog.presets.articles import PRESETS
from vramlab.contract import Status


@dataclass(frozen=True)
class Answer:
    status_line: str
    expected_refusal: str | None
    notes: list[str]


def answer(status: Status, preset: str | None, error_type: str | None, device: str) -> Answer:
    """The status line and the preset's notes for an experiment in ``status``."""
    found = PRESETS.get(preset) if preset else None
    refusal = None
    if found is not None and status == Status.FAILED:
        refusal = found.expected_refusal(error_type)
    if refusal is not None:
        line = f"answered: {refusal} (expected)"
    elif status == Status.FAILED and error_type:
        line = f"failed ({error_type})"
    else:
        line = str(status)
    notes: list[str] = []
    ran = status in (Status.SUCCEEDED, Status.FAILED)
    if found is not None and ran and (without := found.without_gpu(device)) is not None:
        line += " (no GPU: question not answered)"
        notes.append(without)
    if found is not None and found.refusal is not None and status == Status.SUCCEEDED:
        notes.append(
            f"This preset expects PyTorch to refuse ({found.refusal.answer}), "
            f"but this run succeeded: this PyTorch build does not refuse it."
        )
    return Answer(line, refusal, notes)
