"""an experiment's isolation: a clean process of its own, or a worker's shared one

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("isolation", sa.String(length=8), server_default="clean", nullable=False)
        )


def downgrade() -> None:
    # In place (SQLite has dropped columns itself since 3.35): a batch copy of the table
    # would drop the old one, and with foreign keys on that deletes every experiment's
    # tags, result and trace by cascade.
    with op.batch_alter_table("experiments", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("isolation")
