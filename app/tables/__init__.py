"""ORM models, one module per table; importing this package registers them all."""

from app.tables.api_token import ApiToken
from app.tables.base import Base
from app.tables.experiment import Experiment
from app.tables.fit import Fit
from app.tables.result import Result
from app.tables.snapshot import Snapshot
from app.tables.submitter_queue import SubmitterQueue
from app.tables.sweep import Sweep
from app.tables.sweep_count import SweepCount
from app.tables.tag import ExperimentTag
from app.tables.trace_chunk import TraceChunk
from app.tables.worker import Worker

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
