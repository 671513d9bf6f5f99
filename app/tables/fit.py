"""A fit search: the largest batch size or sequence length that fits a memory capacity.

Its variants' search state lives in ``variants`` (JSON); each measured trial is an
ordinary experiment that points back here (``Experiment.fit_id``). ``version`` makes
every change a compare-and-set, so two replicas that advance one fit cannot both win.
"""

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.tables.base import Base, utcnow


class Fit(Base):
    __tablename__ = "fits"
    __table_args__ = (Index("ix_fits_status_created", "status", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # contract.FitStatus
    status: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]]
    vary: Mapped[str] = mapped_column(String(32))
    capacity_bytes: Mapped[int] = mapped_column(BigInteger)
    # Where the capacity came from: "capacity_bytes" or the GPU name it was read for.
    capacity_source: Mapped[str] = mapped_column(String(200))
    max_value: Mapped[int]
    variants: Mapped[list[Any]]
    version: Mapped[int] = mapped_column(default=0)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    submitted_by: Mapped[str | None] = mapped_column(String(36), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
