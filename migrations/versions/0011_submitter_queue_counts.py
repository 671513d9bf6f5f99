"""submitter_queues: each submitter's queued count, kept by triggers on experiments

The quota check (a submitter may have at most VRAMLAB_MAX_QUEUED_PER_TOKEN queued) reads
one row here instead of counting the submitter's queued experiments, which cost a heap
look-up per queued row on PostgreSQL. Every change of an experiment into or out of
``queued`` (insert, claim, cancel, release, requeue, delete), whatever code makes it,
moves the count in the same transaction, so it cannot drift.

PostgreSQL: statement triggers with transition tables; each statement adds its net
change per submitter in the order of the submitters, so two statements that touch the
same submitters (two batch claims) lock their rows in one order and cannot deadlock.
SQLite: row triggers (its one writer at a time needs no order). A later migration that
rebuilds ``experiments`` on SQLite (batch mode, recreate) drops these triggers and must
create them again (``create_triggers``).

Revision ID: 0011
Revises: 0010_fit_searches
Create Date: 2026-11-26 04:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010_fit_searches"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PG_APPLY = """
CREATE FUNCTION submitter_queues_{name}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE d record;
BEGIN
  FOR d IN
    SELECT who, sum(n)::integer AS n FROM ({changes}) AS c
    GROUP BY who HAVING sum(n) <> 0 ORDER BY who
  LOOP
    INSERT INTO submitter_queues AS q (submitter, queued) VALUES (d.who, d.n)
    ON CONFLICT (submitter) DO UPDATE SET queued = q.queued + excluded.queued;
  END LOOP;
  RETURN NULL;
END $$
"""
_PG_IN = "SELECT coalesce(submitted_by, '') AS who, 1 AS n FROM new_rows WHERE status = 'queued'"
_PG_OUT = "SELECT coalesce(submitted_by, '') AS who, -1 AS n FROM old_rows WHERE status = 'queued'"
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

_SQLITE_ADD = """
  INSERT INTO submitter_queues (submitter, queued)
  SELECT coalesce(NEW.submitted_by, ''), 1 WHERE NEW.status = 'queued'
  ON CONFLICT (submitter) DO UPDATE SET queued = queued + 1;"""
_SQLITE_TAKE = """
  UPDATE submitter_queues SET queued = queued - 1
  WHERE OLD.status = 'queued' AND submitter = coalesce(OLD.submitted_by, '');"""
_SQLITE_TRIGGERS = {
    "insert": ("AFTER INSERT ON experiments WHEN NEW.status = 'queued'", _SQLITE_ADD),
    "update": (
        "AFTER UPDATE OF status, submitted_by ON experiments"
        " WHEN OLD.status IS NOT NEW.status OR OLD.submitted_by IS NOT NEW.submitted_by",
        _SQLITE_TAKE + _SQLITE_ADD,
    ),
    "delete": ("AFTER DELETE ON experiments WHEN OLD.status = 'queued'", _SQLITE_TAKE),
}


def create_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name, (event, tables, changes) in _PG_TRIGGERS.items():
            op.execute(_PG_APPLY.format(name=name, changes=changes))
            op.execute(
                f"CREATE TRIGGER submitter_queues_{name} AFTER {event} ON experiments "
                f"REFERENCING {tables} FOR EACH STATEMENT "
                f"EXECUTE FUNCTION submitter_queues_{name}()"
            )
    else:
        for name, (when, body) in _SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER submitter_queues_{name} {when} BEGIN{body}\nEND")


def drop_triggers() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for name in _PG_TRIGGERS:
        op.execute(
            f"DROP TRIGGER submitter_queues_{name}" + (" ON experiments" if postgres else "")
        )
        if postgres:
            op.execute(f"DROP FUNCTION submitter_queues_{name}()")


def upgrade() -> None:
    op.create_table(
        "submitter_queues",
        sa.Column("submitter", sa.String(length=36), nullable=False),
        sa.Column("queued", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("submitter", name=op.f("pk_submitter_queues")),
    )
    op.execute(
        "INSERT INTO submitter_queues (submitter, queued) "
        "SELECT coalesce(submitted_by, ''), count(*) FROM experiments "
        "WHERE status = 'queued' GROUP BY coalesce(submitted_by, '')"
    )
    create_triggers()


def downgrade() -> None:
    drop_triggers()
    op.drop_table("submitter_queues")
