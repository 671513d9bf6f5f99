"""An experiment: a validated spec, its place in the queue, its lease and its outcome."""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.core import contract as models
from app.tables.base import Base, utcnow

if TYPE_CHECKING:
    from app.tables.result import Result
    from app.tables.tag import ExperimentTag


class Experiment(Base):
    __tablename__ = "experiments"
    __table_args__ = (
        Index("ix_experiments_lease", "status", "lease_expires_at"),
        Index("ix_experiments_created", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # "experiment" (queued and run by a worker) or "snapshot" (a PyTorch memory snapshot
    # a user recorded and imported: stored finished, with its trace and a summary).
    kind: Mapped[str] = mapped_column(
        String(16), default="experiment", server_default="experiment", index=True
    )
    # A snapshot's name, as its uploader gave it.
    name: Mapped[str | None] = mapped_column(String(200), default=None)
    status: Mapped[str] = mapped_column(String(16))
    op: Mapped[str] = mapped_column(String(64), index=True)
    shape: Mapped[list[Any]]
    params: Mapped[dict[str, Any]]
    dtype: Mapped[str] = mapped_column(String(32))
    device: Mapped[str] = mapped_column(String(16), index=True)
    # What a worker must have: its device type, enough GPUs, maybe a GPU name or memory.
    device_type: Mapped[str] = mapped_column(String(8))
    gpus_needed: Mapped[int] = mapped_column(default=0)
    gpu_name: Mapped[str | None] = mapped_column(String(200), default=None)
    min_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    warmup: Mapped[int]
    repeat: Mapped[int]
    timeout_s: Mapped[float]
    allocator: Mapped[dict[str, Any]]
    trace_mode: Mapped[str] = mapped_column(String(8))
    # contract.Isolation: a clean process of its own, or a worker's shared one.
    isolation: Mapped[str] = mapped_column(String(8), default="clean", server_default="clean")
    priority: Mapped[int] = mapped_column(default=0)
    prediction: Mapped[dict[str, Any]]
    # A scenario: named-tensor steps instead of one op (None for a single op).
    steps: Mapped[list[Any] | None] = mapped_column(default=None)
    # The preset this experiment was queued from, if any.
    preset: Mapped[str | None] = mapped_column(String(64), default=None, index=True)
    sweep_id: Mapped[str | None] = mapped_column(
        ForeignKey("sweeps.id", ondelete="SET NULL"), default=None, index=True
    )
    # The fit search this experiment is a measured trial of, if any. No foreign key: adding
    # one to this table on SQLite rebuilds it (and its drop cascades into every result);
    # fits are never deleted, so the id always names one.
    fit_id: Mapped[str | None] = mapped_column(String(36), default=None, index=True)
    # Who submitted it (an API token's id; None while the API runs open) and the
    # client's Idempotency-Key, namespaced by that token, unique.
    submitted_by: Mapped[str | None] = mapped_column(String(36), default=None)
    idempotency_key: Mapped[str | None] = mapped_column(String(300), default=None, unique=True)

    attempts: Mapped[int] = mapped_column(default=0)
    lease_token: Mapped[str | None] = mapped_column(String(64), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    worker_id: Mapped[str | None] = mapped_column(
        ForeignKey("workers.id", ondelete="SET NULL"), default=None
    )
    cancel_requested: Mapped[bool] = mapped_column(default=False)

    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When it (last) became claimable: its creation, or when an expired lease requeued it
    # (so a requeued experiment waits behind those queued before it, at its priority).
    available_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)

    error_type: Mapped[str | None] = mapped_column(String(32), default=None)
    error_message: Mapped[str | None] = mapped_column(Text, default=None)
    error_hint: Mapped[str | None] = mapped_column(Text, default=None)
    error_details: Mapped[dict[str, Any] | None] = mapped_column(default=None)

    result: Mapped["Result | None"] = relationship(
        back_populates="experiment", cascade="all, delete-orphan", uselist=False, lazy="selectin"
    )
    tag_rows: Mapped[list["ExperimentTag"]] = relationship(
        back_populates="experiment", cascade="all, delete-orphan", lazy="selectin"
    )

    @property
    def predicted(self) -> models.Prediction | None:
        """The catalog's prediction; None for an imported snapshot (nothing was planned)."""
        return models.Prediction.model_validate(self.prediction) if self.prediction else None

    @property
    def measured(self) -> models.Result | models.SnapshotResult | None:
        """The stored result as the contract's model (validated when it was reported)."""
        if self.result is None:
            return None
        if self.kind == "snapshot":
            return models.SnapshotResult.model_validate(self.result.data)
        return models.Result.model_validate(self.result.data)

    @property
    def tags(self) -> list[str]:
        return [row.tag for row in self.tag_rows]


# The claim's order: queued work by priority, then the longest available first.
Index(
    "ix_experiments_claim",
    Experiment.status,
    Experiment.priority.desc(),
    Experiment.available_at,
    Experiment.id,
)
