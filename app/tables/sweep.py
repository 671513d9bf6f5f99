"""A sweep: a base spec and a grid whose product was queued as experiments."""

from datetime import datetime
from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from app.tables.base import Base, utcnow


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    spec: Mapped[dict[str, Any]]
    grid: Mapped[dict[str, Any]]
    n_points: Mapped[int]
    submitted_by: Mapped[str | None] = mapped_column(String(36), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
