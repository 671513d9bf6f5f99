"""How many experiments each submitter has queued: the quota's count, kept exact by the
database (triggers on ``experiments``, migration 0011), so checking it costs one row
however long the queue is."""

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from app.tables.base import Base

# The key of experiments submitted without a token (the open service).
OPEN_SUBMITTER = ""


class SubmitterQueue(Base):
    __tablename__ = "submitter_queues"

    # Experiment.submitted_by, or OPEN_SUBMITTER for None.
    submitter: Mapped[str] = mapped_column(String(36), primary_key=True)
    queued: Mapped[int] = mapped_column(default=0)
