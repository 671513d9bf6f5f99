"""snapshots: experiments gain a kind and a name; a table for imported snapshots

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 10:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.tables.base

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("kind", sa.String(length=16), server_default="experiment", nullable=False)
        )
        batch_op.add_column(sa.Column("name", sa.String(length=200), nullable=True))
        batch_op.create_index(batch_op.f("ix_experiments_kind"), ["kind"], unique=False)
    op.create_table(
        "snapshots",
        sa.Column("experiment_id", sa.String(length=36), nullable=False),
        sa.Column("file_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("gzipped", sa.Boolean(), nullable=False),
        sa.Column("segments", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", app.tables.base.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_snapshots_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", name=op.f("pk_snapshots")),
    )
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_snapshots_sha256"), ["sha256"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("snapshots", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_snapshots_sha256"))
    op.drop_table("snapshots")
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_experiments_kind"))
        batch_op.drop_column("name")
        batch_op.drop_column("kind")
