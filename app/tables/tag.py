"""A tag on an experiment, in its own table so that filtering by tag is an index look-up.

Each row carries a copy of its experiment's ``created_at`` (which never changes), so that
a page of one tag's experiments, newest first, is a walk down one index,
``(tag, created_at, experiment_id)``, however rare or common the tag.
"""

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.tables.base import Base

if TYPE_CHECKING:
    from app.tables.experiment import Experiment


class ExperimentTag(Base):
    __tablename__ = "experiment_tags"
    __table_args__ = (Index("ix_experiment_tags_newest", "tag", "created_at", "experiment_id"),)

    experiment_id: Mapped[str] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The experiment's created_at, copied when the tag is written: the order of a listing.
    created_at: Mapped[datetime]

    experiment: Mapped["Experiment"] = relationship(back_populates="tag_rows")
