"""What the API says about an imported memory snapshot."""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, computed_field

from app.figures.schemas import BlockOut, PeakMoment


class SnapshotBlock(BlockOut):
    category: str = Field(default="", description="the block's category (see categories)")
    reason: str = Field(default="", description="the evidence that put the block there")
    recorded: bool = Field(
        default=False,
        description="true when the program recorded it (vramlab record: a parameter, "
        "gradient or optimizer state by tensor identity), not inferred",
    )


class CategoryReason(BaseModel):
    reason: str = Field(description="the evidence, as the blocks' own")
    bytes: int
    blocks: int


class CategoryOut(BaseModel):
    category: str = Field(
        description="parameters, gradients, optimizer_state, activations, temporaries, other "
        "or unknown (the evidence does not decide: see reasons)"
    )
    bytes: int = Field(description="bytes of the blocks alive at the peak in this category")
    blocks: int
    rule: str = Field(description="the rule that put blocks here")
    inference: bool = Field(
        default=True,
        description="true: inferred from stacks and lifetimes; false: recorded by the program "
        "itself (vramlab record's parameters, gradients and optimizer state)",
    )
    recorded_bytes: int = Field(
        default=0, description="of bytes, those whose category the program recorded"
    )
    reasons: list[CategoryReason] = Field(
        default_factory=list,
        description="the evidence that put blocks here, most bytes first (snapshots imported "
        "before reasons were kept have none)",
    )


class SegmentRow(BaseModel):
    address: int | None
    total_size: int
    allocated: int
    free: int
    largest_free_block: int
    blocks: int
    segment_type: str
    stream: int | None
    is_expandable: bool


class SegmentsOut(BaseModel):
    """What the allocator held when the snapshot was taken."""

    count: int
    reserved: int
    allocated: int
    free: int
    largest_free_block: int
    fragmentation: float = Field(
        description="1 - largest free block / free bytes: 0 when free memory is one block"
    )
    reserved_by_type: dict[str, int]
    largest: list[SegmentRow] = Field(description="the largest segments")


class OomOut(BaseModel):
    seq: int
    t_us: float
    requested: int
    device_free: int | None
    frames: list[dict[str, Any]] = Field(default_factory=list)


class SnapshotOut(BaseModel):
    id: str
    kind: str = "snapshot"
    name: str
    tags: list[str]
    status: str
    created_at: datetime
    submitted_by: str | None = None
    file_bytes: int = Field(description="the uploaded file's size")
    sha256: str
    gzipped: bool
    device: str
    entries: int = Field(description="trace entries of the chosen device")
    events: int = Field(description="events stored (entries plus blocks from before the trace)")
    time_recorded: bool = Field(description="false for snapshots whose entries carry no time")
    pre_trace: dict[str, int] = Field(
        description="blocks and segments that existed before the trace's first entry"
    )
    memory: dict[str, int | None] = Field(description="replayed from the trace")
    counters: dict[str, int] | None = Field(
        default=None, description="PyTorch's own counters, where the recorder saved them"
    )
    peak: PeakMoment | None
    alive_count: int
    alive_at_peak: list[SnapshotBlock]
    largest: list[SnapshotBlock]
    categories: list[CategoryOut]
    categories_recorded: dict[str, Any] | None = Field(
        default=None,
        description="what vramlab record noted from inside the program: tensors (sightings "
        "of parameters, gradients and optimizer state), matched_by_time (false: by address "
        "alone), truncated (the oldest sightings went), hook_errors; null for a snapshot "
        "without",
    )
    phases_recorded: dict[str, Any] | None = Field(
        default=None,
        description="where vramlab record marked the program's forwards, backwards and "
        "optimizer steps: marks, used (false: problem says why the counts could not be tied "
        "to the trace), truncated, hook_errors; null for a snapshot without",
    )
    segments: SegmentsOut
    ooms: list[OomOut]
    oom_count: int
    devices: list[dict[str, int]]
    environment: dict[str, Any]
    allocator_settings: dict[str, Any]
    program_exit: int | None = Field(
        default=None,
        description="how the recorded program ended, where the recorder said: its exit "
        "status, or minus the signal that killed it",
    )
    import_cost: dict[str, float | int | None] = Field(
        default_factory=dict,
        alias="import",
        description="what parsing cost: wall and CPU seconds, the parser's peak RSS (the "
        "largest of any child of the API so far), the pickle's bytes once decompressed",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="true when the recorded program did not end well (program_exit not 0): "
        "the snapshot holds the run up to its failure, not a whole run"
    )
    @property
    def partial(self) -> bool:
        return self.program_exit not in (None, 0)


class SnapshotPage(BaseModel):
    items: list[SnapshotOut]
    next_cursor: str | None
