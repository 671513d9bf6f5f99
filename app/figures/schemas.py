"""Responses about an experiment's trace: the peak and the blocks that held it."""

from typing import Any

from pydantic import BaseModel, Field


class BlockOut(BaseModel):
    """One allocation seen in the trace."""

    addr: int | None
    size: int
    seq: int
    t_us: float = Field(description="microseconds from the experiment's start")
    phase: str | None
    frames: list[dict[str, Any]] = Field(default_factory=list)


class PeakMoment(BaseModel):
    seq: int | None
    t_us: float
    phase: str | None
    allocated: int
    reserved: int | None = Field(description="null where the trace records no segments (CPU)")


class PeakOut(BaseModel):
    experiment_id: str
    events: int
    peak: PeakMoment | None
    alive_at_peak: list[BlockOut] = Field(description="blocks alive at the peak, largest first")
    alive_count: int
    largest: list[BlockOut] = Field(description="the largest allocations of the whole trace")
    measured_allocated_peak: int | None = Field(
        default=None, description="result.memory.allocated_peak, from the allocator's stats"
    )
