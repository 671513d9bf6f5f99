"""What a worker measured for a succeeded (or out-of-memory) experiment."""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.tables.base import Base, utcnow

if TYPE_CHECKING:
    from app.tables.experiment import Experiment


class Result(Base):
    __tablename__ = "results"

    experiment_id: Mapped[str] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    worker_id: Mapped[str | None] = mapped_column(String(36), default=None)
    attempt: Mapped[int]
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    experiment: Mapped["Experiment"] = relationship(back_populates="result")
