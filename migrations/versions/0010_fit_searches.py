"""fit searches: a fits table, and experiments.fit_id for a fit's measured trials

Revision ID: 0010_fit_searches
Revises: 0008
Create Date: 2026-11-25 20:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.tables.base

revision: str = "0010_fit_searches"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fits",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("vary", sa.String(length=32), nullable=False),
        sa.Column("capacity_bytes", sa.BigInteger(), nullable=False),
        sa.Column("capacity_source", sa.String(length=200), nullable=False),
        sa.Column("max_value", sa.Integer(), nullable=False),
        sa.Column("variants", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("submitted_by", sa.String(length=36), nullable=True),
        sa.Column("created_at", app.tables.base.UTCDateTime(), nullable=False),
        sa.Column("finished_at", app.tables.base.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fits")),
    )
    op.create_index("ix_fits_status_created", "fits", ["status", "created_at"], unique=False)
    # No foreign key (see Experiment.fit_id): the column is added in place on both engines.
    with op.batch_alter_table("experiments", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("fit_id", sa.String(length=36), nullable=True))
        batch_op.create_index(batch_op.f("ix_experiments_fit_id"), ["fit_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("experiments", schema=None, recreate="never") as batch_op:
        batch_op.drop_index(batch_op.f("ix_experiments_fit_id"))
        batch_op.drop_column("fit_id")
    op.drop_index("ix_fits_status_created", table_name="fits")
    op.drop_table("fits")
