"""A comparison of experiments: one item each, side by side."""

from typing import Any

from pydantic import BaseModel, Field

from vramlab.contract import Status


class CompareItem(BaseModel):
    id: str
    kind: str = Field(default="experiment", description="experiment or snapshot")
    status: Status
    label: str
    spec: dict[str, Any]
    model: dict[str, Any] | None = Field(
        default=None,
        description="a model experiment's knobs that set its size (model, batch_size, "
        "seq_len, precision, ...), its predicted peak and the device it is predicted for",
    )
    figures: dict[str, float | int | None]
    shared_process_figures: list[str] = Field(
        default_factory=list,
        description="figures that depend on what ran earlier in the same shared process "
        "(host RSS after earlier experiments), not on this experiment alone",
    )


class CompareOut(BaseModel):
    items: list[CompareItem]
    differences: dict[str, list[float | int | None]] = Field(
        description="each figure's difference from the first experiment's"
    )
    environment: dict[str, list[Any]] = Field(description="environment keys whose values differ")
    environment_same: dict[str, Any]
    categories: dict[str, list[int | None]] = Field(
        default_factory=dict,
        description="bytes alive at the peak by category (snapshots: inferred, or recorded by "
        "the program under vramlab record; a model experiment: measured at its step's peak; "
        "null for an op's experiment, whose trace is not categorised)",
    )
    predicted_categories: dict[str, list[int | None]] = Field(
        default_factory=dict,
        description="a model experiment's predicted bytes at its step's peak by category "
        "(null for what has no such prediction)",
    )
    summary: list[str] = Field(
        default_factory=list,
        description="each item against the first, in words: its peak and the category "
        "that differs most",
    )
