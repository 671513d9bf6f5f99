"""ORM models, one module per table; importing this package registers them all."""

from app.models.api_token import ApiToken
from app.models.base import Base
from app.models.experiment import Experiment
from app.models.fit import Fit
from app.models.result import Result
from app.models.snapshot import Snapshot
from app.models.submitter_queue import SubmitterQueue
from app.models.sweep import Sweep
from app.models.sweep_count import SweepCount
from app.models.tag import ExperimentTag
from app.models.trace_chunk import TraceChunk
from app.models.worker import Worker

__all__ = [
    "ApiToken",
    "Base",
    "Experiment",
    "ExperimentTag",
    "Fit",
    "Result",
    "Snapshot",
    "SubmitterQueue",
    "Sweep",
    "SweepCount",
    "TraceChunk",
    "Worker",
]
