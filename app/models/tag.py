"""A tag on an experiment, in its own table so that filtering by tag is an index look-up."""

from typing import TYPE_CHECKING

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.models.base import Base

if TYPE_CHECKING:
    from app.models.experiment import Experiment


class ExperimentTag(Base):
    __tablename__ = "experiment_tags"

    experiment_id: Mapped[str] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)

    experiment: Mapped["Experiment"] = relationship(back_populates="tag_rows")
