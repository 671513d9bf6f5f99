"""A worker: a process on some host that claims experiments and runs them."""

from datetime import datetime
from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from app.tables.base import Base, utcnow


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    hostname: Mapped[str] = mapped_column(String(255), default="")
    # What the worker declared: device types, GPUs with names and memory, versions.
    capabilities: Mapped[dict[str, Any]]
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    # The token that registered it (None: the open service): only that token may act as it.
    registered_by: Mapped[str | None] = mapped_column(String(36), default=None)
    # Set when the worker says it exits (POST /v1/worker/stop). Whether it is busy, and
    # with what, is read from the experiments it leases, never kept twice.
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
