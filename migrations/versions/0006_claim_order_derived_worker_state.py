"""claim order with available_at, worker state derived, unread columns dropped

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 10:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.tables.base

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("available_at", app.tables.base.UTCDateTime(), nullable=True))
    op.execute("UPDATE experiments SET available_at = created_at")
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.alter_column(
            "available_at", existing_type=app.tables.base.UTCDateTime(), nullable=False
        )
        batch_op.drop_index("ix_experiments_queue")
        batch_op.drop_column("predicted_bytes")
        batch_op.drop_column("progress")
    # Outside the batch: SQLite's table copy cannot name an expression as a column.
    op.create_index(
        "ix_experiments_claim",
        "experiments",
        ["status", sa.text("priority DESC"), "available_at", "id"],
        unique=False,
    )
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_column("trace_events")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stopped_at", app.tables.base.UTCDateTime(), nullable=True))
        batch_op.drop_column("state")
        batch_op.drop_column("current_experiment_id")


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("current_experiment_id", sa.String(length=36), nullable=True))
        batch_op.add_column(
            sa.Column("state", sa.String(length=16), nullable=False, server_default="idle")
        )
        batch_op.drop_column("stopped_at")
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("trace_events", sa.Integer(), nullable=False, server_default="0")
        )
    op.drop_index("ix_experiments_claim", table_name="experiments")
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("progress", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("predicted_bytes", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch_op.create_index(
            "ix_experiments_queue", ["status", "priority", "created_at"], unique=False
        )
        batch_op.drop_column("available_at")
