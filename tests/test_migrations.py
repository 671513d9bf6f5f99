"""The migrations build exactly the schema the models describe, on both engines."""

import httpx
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from app.core.config import normalise_database_url
from app.core.migrate import alembic_config
from app.tables import Base
from tests.conftest import LiveServer, make_settings
from tests.helpers import ADD, submit
from tests.results.trace_data import churn, upload


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


def test_tag_rows_get_their_experiments_created_at_on_upgrade(database_url: str) -> None:
    """0007 copies each experiment's created_at into its tag rows, the listing's order."""
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        ids = [submit(c, ADD, tags=["a", "b"] if i % 2 else ["a"])["id"] for i in range(5)]
    url = normalise_database_url(database_url)
    command.downgrade(alembic_config(url), "0006")
    command.upgrade(alembic_config(url), "head")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t.tag, t.created_at = e.created_at FROM experiment_tags t "
                    "JOIN experiments e ON e.id = t.experiment_id"
                )
            ).all()
    finally:
        engine.dispose()
    assert sorted(tag for tag, _ in rows) == ["a"] * 5 + ["b"] * 2
    assert all(same for _, same in rows)
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        listed = c.get("/v1/experiments", params={"tag": "a", "limit": 2}).json()
        assert [e["id"] for e in listed["items"]] == ids[::-1][:2]
        after = c.get(
            "/v1/experiments", params={"tag": "a", "limit": 5, "cursor": listed["next_cursor"]}
        ).json()
        assert [e["id"] for e in after["items"]] == ids[::-1][2:]


def test_experiments_from_before_isolation_read_back_clean(database_url: str) -> None:
    """0008 gives every experiment already stored isolation 'clean', as it ran."""
    url = normalise_database_url(database_url)
    command.downgrade(alembic_config(url), "0007")
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        engine = create_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(
                    text(
                        "INSERT INTO experiments (id, kind, status, op, shape, params, dtype, "
                        "device, device_type, gpus_needed, warmup, repeat, timeout_s, "
                        "allocator, trace_mode, priority, prediction, attempts, "
                        "cancel_requested, created_at, available_at) VALUES ('old', "
                        "'experiment', 'queued', 'add', '[4]', '{}', 'float32', 'cpu', 'cpu', "
                        "0, 1, 3, 60, '{}', 'events', 0, '{}', 0, false, "
                        "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    )
                )
        finally:
            engine.dispose()
        command.upgrade(alembic_config(url), "head")
        assert c.get("/v1/experiments/old").json()["spec"]["isolation"] == "clean"


def test_a_trace_stored_before_its_columns_exports_the_same(database_url: str) -> None:
    """0012 adds the columns a plain chunk keeps; chunks stored before have none and are
    exported from their text: the same bytes (downgraded and upgraded again here)."""

    def export(c: httpx.Client, exp_id: str) -> bytes:
        response = c.get(f"/v1/experiments/{exp_id}/trace", params={"format": "memory_viz"})
        assert response.status_code == 200
        return response.content

    url = normalise_database_url(database_url)
    with LiveServer(make_settings(database_url)) as live, httpx.Client(base_url=live.url) as c:
        exp_id = upload(c, ADD, [churn(3000), churn(2000, 1, 3000)])
        from_columns = export(c, exp_id)
        command.downgrade(alembic_config(url), "0011")
        command.upgrade(alembic_config(url), "head")
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                stored = conn.execute(
                    text("SELECT event_columns FROM trace_chunks WHERE experiment_id = :e"),
                    {"e": exp_id},
                ).scalars()
                assert list(stored) == [None, None]
        finally:
            engine.dispose()
        assert export(c, exp_id) == from_columns
