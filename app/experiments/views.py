"""An experiment as clients read it (``ExperimentOut``), and the fields a worker gets to
run it: built from its row, or from a submit's insert without reading it back."""

from typing import Any

from app.core.contract import Prediction
from app.core.data import STORED
from app.experiments import answers
from app.experiments.schemas import ExperimentError, ExperimentOut, QueueInfo
from app.experiments.spec_schemas import ExperimentSpec
from app.experiments.specs import AcceptedSpec
from app.tables import Experiment
from vramlab.contract import Status


def off_prediction(out: ExperimentOut) -> str | None:
    """A few words when the measured delta is far from the catalog's prediction (more than
    a quarter and more than 1 MiB apart), for the list page to flag; else None."""
    if out.result is None or out.prediction is None:
        return None
    measured, predicted = out.result.memory.delta_allocated, out.prediction.delta_allocated
    gap = measured - predicted
    if abs(gap) <= max(2**20, abs(predicted) // 4):
        return None
    ratio = f"{measured / predicted:.2g} times the prediction" if predicted > 0 else "unpredicted"
    return f"measured {ratio} ({'+' if gap > 0 else '-'}{abs(gap):,} bytes): see its notes"


def run_fields(exp: Experiment) -> dict[str, Any]:
    """What running the experiment needs: the spec as accepted (the worker gets these)."""
    return {
        "op": exp.op,
        "shape": exp.shape,
        "params": exp.params,
        "dtype": exp.dtype,
        "device": exp.device,
        "warmup": exp.warmup,
        "repeat": exp.repeat,
        "timeout_s": exp.timeout_s,
        "allocator": exp.allocator,
        "trace": exp.trace_mode,
        "isolation": exp.isolation,
        "steps": exp.steps,
    }


def queued_out(row: dict[str, Any], accepted: AcceptedSpec, queue: QueueInfo) -> ExperimentOut:
    """The answer to a submit, from the row it inserted and the spec as accepted: what
    ``to_out`` gives when the experiment is read back, without reading it back."""
    return ExperimentOut(
        id=row["id"],
        status=Status.QUEUED,
        status_line=str(Status.QUEUED),
        spec=accepted.spec,
        attempts=0,
        worker_id=None,
        submitted_by=row["submitted_by"],
        created_at=row["created_at"],
        started_at=None,
        finished_at=None,
        queue=queue,
        prediction=Prediction.model_validate(row["prediction"]),
        preset=row["preset"],
    )


def to_out(exp: Experiment, queue: QueueInfo | None = None) -> ExperimentOut:
    spec = ExperimentSpec.model_validate(
        {
            **run_fields(exp),
            "tags": exp.tags,
            "priority": exp.priority,
            "requirements": {"gpu_name": exp.gpu_name, "min_memory_bytes": exp.min_memory_bytes},
        },
        context=STORED,  # read back as stored, even if a later rule would refuse it
    )
    error = None
    if exp.error_type is not None:
        error = ExperimentError.model_validate(
            {
                "type": exp.error_type,
                "message": exp.error_message or "",
                "hint": exp.error_hint,
                "details": exp.error_details,
            }
        )
    said = answers.answer(Status(exp.status), exp.preset, exp.error_type, exp.device)
    return ExperimentOut(
        id=exp.id,
        kind=exp.kind,  # type: ignore[arg-type]
        name=exp.name,
        status=Status(exp.status),
        status_line=said.status_line,
        expected_refusal=said.expected_refusal,
        preset_notes=said.notes,
        spec=spec,
        attempts=exp.attempts,
        worker_id=exp.worker_id,
        submitted_by=exp.submitted_by,
        created_at=exp.created_at,
        started_at=exp.started_at,
        finished_at=exp.finished_at,
        cancel_requested=exp.cancel_requested,
        queue=queue,
        prediction=exp.predicted,
        preset=exp.preset,
        result=exp.measured,
        error=error,
    )
