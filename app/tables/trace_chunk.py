"""A trace is stored as gzip-compressed NDJSON chunks of consecutive events.

A million events make about a hundred chunks rather than a million rows: inserts stay
cheap on both engines, and a page or a stream decompresses only the chunks it needs.

``event_columns``: where every event of the chunk is plain (or plain but for frames of
the usual shape), the fields the memory_viz export reads, as columns kept when it was
uploaded, with the chunk's stacks where it has frames (``app.traces.event_columns``);
null for other chunks and those stored before (migration 0012). Deferred: only the export
loads it.
"""

from sqlalchemy import ForeignKey, Integer, LargeBinary
from sqlalchemy.orm import Mapped, deferred, mapped_column

from app.tables.base import Base


class TraceChunk(Base):
    __tablename__ = "trace_chunks"

    experiment_id: Mapped[str] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    first_event: Mapped[int]
    n_events: Mapped[int]
    data: Mapped[bytes] = mapped_column(LargeBinary)
    event_columns: Mapped[bytes | None] = deferred(mapped_column(LargeBinary, nullable=True))
