"""How many of a sweep's experiments are in each status: its progress, kept exact by the
database (triggers on ``experiments``, migration 0014), so reading it costs one row
however many points the sweep has."""

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from app.tables.base import Base


class SweepCount(Base):
    __tablename__ = "sweep_counts"

    # Sweep.id; no foreign key: the triggers write here in whatever order the statements
    # on ``experiments`` come, and a sweep's row only ever holds its members' counts.
    sweep_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # One column per status (vramlab.contract.Status).
    queued: Mapped[int] = mapped_column(default=0)
    running: Mapped[int] = mapped_column(default=0)
    succeeded: Mapped[int] = mapped_column(default=0)
    failed: Mapped[int] = mapped_column(default=0)
    cancelled: Mapped[int] = mapped_column(default=0)
