"""drop the index for counting a submitter's queued experiments

The quota reads each submitter's kept count (submitter_queues, 0011), so nothing reads
``ix_experiments_submitter_queued`` any more, and every insert and every change of status
still wrote it. Dropped in place on both engines (no copy of the table, so SQLite's
triggers of 0011 stay as they are).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 08:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_experiments_submitter_queued", table_name="experiments")


def downgrade() -> None:
    op.create_index(
        "ix_experiments_submitter_queued", "experiments", ["status", "submitted_by"], unique=False
    )
