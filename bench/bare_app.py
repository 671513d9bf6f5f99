"""The yardstick for bench/api.py: the least a FastAPI service can do per submit.

Its POST validates a small pydantic body and inserts one row with SQLAlchemy in a
request's transaction, on the same database (SQLite in WAL mode, as vramlab runs it, or
PostgreSQL). Run as ``python bench/bare_app.py --port P`` with ``BARE_DATABASE_URL`` set.
"""

import argparse
import os
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI
from pydantic import BaseModel, Field
from sqlalchemy import JSON, String, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "bare_items"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    op: Mapped[str] = mapped_column(String(64))
    shape: Mapped[list[Any]] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(32))
    device: Mapped[str] = mapped_column(String(16))


class ItemIn(BaseModel):
    op: str = Field(max_length=64)
    shape: list[int] = Field(max_length=8)
    dtype: str = Field(default="float32", max_length=32)
    device: str = Field(default="cpu", max_length=16)


def make_app(url: str) -> FastAPI:
    engine = create_engine(url, pool_size=10, max_overflow=20)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)

    def session() -> Iterator[Session]:
        with factory() as s, s.begin():
            yield s

    app = FastAPI()

    @app.post("/items", status_code=202)
    def create(body: ItemIn, s: Annotated[Session, Depends(session)]) -> dict[str, str]:
        item = Item(id=str(uuid.uuid4()), **body.model_dump())
        s.add(item)
        return {"id": item.id, "status": "queued"}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = make_app(os.environ["BARE_DATABASE_URL"])
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
