"""tag rows carry their experiment's created_at; one index lists a tag newest first

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22 13:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.tables.base

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiment_tags", schema=None) as batch_op:
        batch_op.add_column(sa.Column("created_at", app.tables.base.UTCDateTime(), nullable=True))
    op.execute(
        "UPDATE experiment_tags SET created_at = (SELECT experiments.created_at FROM "
        "experiments WHERE experiments.id = experiment_tags.experiment_id)"
    )
    with op.batch_alter_table("experiment_tags", schema=None) as batch_op:
        batch_op.alter_column(
            "created_at", existing_type=app.tables.base.UTCDateTime(), nullable=False
        )
        batch_op.drop_index("ix_experiment_tags_tag")
        batch_op.create_index(
            "ix_experiment_tags_newest", ["tag", "created_at", "experiment_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("experiment_tags", schema=None) as batch_op:
        batch_op.drop_index("ix_experiment_tags_newest")
        batch_op.create_index("ix_experiment_tags_tag", ["tag"], unique=False)
        batch_op.drop_column("created_at")
