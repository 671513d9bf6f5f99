"""What an imported memory snapshot keeps besides its experiment row, result and trace:
the file's size and digest, and its segments as PyTorch wrote them (gzip JSON), which the
memory_viz export gives back."""

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from app.tables.base import Base, utcnow


class Snapshot(Base):
    __tablename__ = "snapshots"

    experiment_id: Mapped[str] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    file_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    gzipped: Mapped[bool]
    segments: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
