"""The run spec a claim hands a worker, built once from the experiment's row."""

from app.core.config import Settings
from app.tables import Experiment
from vramlab.runspec import RunSpec


def run_spec(exp: Experiment, settings: Settings) -> RunSpec:
    """What the worker runs: the spec as accepted, its prediction, and the service's byte
    cap (the worker holds the run to it, not only the plan)."""
    return RunSpec.from_wire(
        {
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
            "prediction": exp.prediction,
            "memory_limit_bytes": settings.max_experiment_bytes,
        }
    )
