"""The migrations build exactly the schema the models describe, on both engines."""

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from app.core.config import normalise_database_url
from app.core.migrate import alembic_config
from app.models import Base


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = create_engine(normalise_database_url(database_url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "render_as_batch": True}
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_downgrade_to_nothing_and_back(database_url: str) -> None:
    url = normalise_database_url(database_url)
    command.downgrade(alembic_config(url), "base")
    engine = create_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        command.upgrade(alembic_config(url), "head")
        assert {"experiments", "results", "trace_chunks", "workers", "sweeps", "api_tokens"} <= set(
            inspect(engine).get_table_names()
        )
    finally:
        engine.dispose()
