"""sweep_counts: each sweep's experiments by status, kept by triggers on experiments

A sweep's progress (``GET /v1/sweeps/{id}/progress``, the progress bar's read) reads one
row here instead of counting the sweep's experiments, so it costs the same at 10 points or
10,000. Every change of a member experiment's status (insert, claim, outcome, cancel,
release, requeue, delete), whatever code makes it, moves the counts in the same
transaction, as 0011 keeps each submitter's queued count.

One row per sweep with a column per status, so a statement locks one row per sweep;
PostgreSQL's statement triggers take the sweeps of a statement in the order of their ids
(two batch claims cannot deadlock on them). SQLite: row triggers. A later migration that
rebuilds ``experiments`` on SQLite (batch mode, recreate) drops these triggers and must
create them again (``create_triggers``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 21:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
_COLUMNS = ", ".join(STATUSES)

_PG_APPLY = """
CREATE FUNCTION sweep_counts_{name}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
  FOR d IN
    SELECT sweep_id, {sums} FROM ({changes}) AS c
    GROUP BY sweep_id HAVING {any_change} ORDER BY sweep_id
  LOOP
    INSERT INTO sweep_counts AS s (sweep_id, {columns}) VALUES (d.sweep_id, {values})
    ON CONFLICT (sweep_id) DO UPDATE SET {adds};
  END LOOP;
  RETURN NULL;
END $$
"""
_PG_IN = "SELECT sweep_id, status, 1 AS n FROM new_rows WHERE sweep_id IS NOT NULL"
_PG_OUT = "SELECT sweep_id, status, -1 AS n FROM old_rows WHERE sweep_id IS NOT NULL"
_PG_TRIGGERS = {
    # name: (event, transition tables, the changes it counts)
    "insert": ("INSERT", "NEW TABLE AS new_rows", _PG_IN),
    "update": (
        "UPDATE",  # PostgreSQL takes no column list with transition tables
        "OLD TABLE AS old_rows NEW TABLE AS new_rows",
        f"{_PG_IN} UNION ALL {_PG_OUT}",
    ),
    "delete": ("DELETE", "OLD TABLE AS old_rows", _PG_OUT),
}


def _pg_sum(status: str) -> str:
    return f"sum(CASE WHEN status = '{status}' THEN n ELSE 0 END)"


def _pg_function(name: str, changes: str) -> str:
    return _PG_APPLY.format(
        name=name,
        changes=changes,
        columns=_COLUMNS,
        sums=", ".join(f"{_pg_sum(s)}::integer AS {s}" for s in STATUSES),
        any_change=" OR ".join(f"{_pg_sum(s)} <> 0" for s in STATUSES),
        values=", ".join(f"d.{s}" for s in STATUSES),
        adds=", ".join(f"{s} = s.{s} + excluded.{s}" for s in STATUSES),
    )


def _sqlite_add(row: str) -> str:
    flags = ", ".join(f"{row}.status = '{s}'" for s in STATUSES)
    adds = ", ".join(f"{s} = {s} + excluded.{s}" for s in STATUSES)
    return (
        f"\n  INSERT INTO sweep_counts (sweep_id, {_COLUMNS}) SELECT {row}.sweep_id, {flags}"
        f" WHERE {row}.sweep_id IS NOT NULL\n  ON CONFLICT (sweep_id) DO UPDATE SET {adds};"
    )


def _sqlite_take(row: str) -> str:
    takes = ", ".join(f"{s} = {s} - ({row}.status = '{s}')" for s in STATUSES)
    return f"\n  UPDATE sweep_counts SET {takes} WHERE sweep_id = {row}.sweep_id;"


_SQLITE_TRIGGERS = {
    "insert": ("AFTER INSERT ON experiments WHEN NEW.sweep_id IS NOT NULL", _sqlite_add("NEW")),
    "update": (
        "AFTER UPDATE OF status, sweep_id ON experiments"
        " WHEN OLD.status IS NOT NEW.status OR OLD.sweep_id IS NOT NEW.sweep_id",
        _sqlite_take("OLD") + _sqlite_add("NEW"),
    ),
    "delete": ("AFTER DELETE ON experiments WHEN OLD.sweep_id IS NOT NULL", _sqlite_take("OLD")),
}


def create_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name, (event, tables, changes) in _PG_TRIGGERS.items():
            op.execute(_pg_function(name, changes))
            op.execute(
                f"CREATE TRIGGER sweep_counts_{name} AFTER {event} ON experiments "
                f"REFERENCING {tables} FOR EACH STATEMENT "
                f"EXECUTE FUNCTION sweep_counts_{name}()"
            )
    else:
        for name, (when, body) in _SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER sweep_counts_{name} {when} BEGIN{body}\nEND")


def drop_triggers() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name in _PG_TRIGGERS:
        op.execute(f"DROP TRIGGER sweep_counts_{name}" + (" ON experiments" if postgres else ""))
        if postgres:
            op.execute(f"DROP FUNCTION sweep_counts_{name}()")


def upgrade() -> None:
    op.create_table(
        "sweep_counts",
        sa.Column("sweep_id", sa.String(length=36), nullable=False),
        *(sa.Column(s, sa.Integer(), nullable=False) for s in STATUSES),
        sa.PrimaryKeyConstraint("sweep_id", name=op.f("pk_sweep_counts")),
    )
    sums = ", ".join(f"sum(CASE WHEN status = '{s}' THEN 1 ELSE 0 END)" for s in STATUSES)
    op.execute(
        f"INSERT INTO sweep_counts (sweep_id, {_COLUMNS}) SELECT sweep_id, {sums} "
        "FROM experiments WHERE sweep_id IS NOT NULL GROUP BY sweep_id"
    )
    create_triggers()


def downgrade() -> None:
    drop_triggers()
    op.drop_table("sweep_counts")
