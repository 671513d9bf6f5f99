"""trace_chunks.event_columns: a plain chunk's events as the memory_viz export's columns

Kept when a chunk is uploaded (``app.traces.event_columns``), so the export reads them
instead of decoding the stored text again. Null for chunks stored before, which the
export reads from their text as it did. Added and dropped in place on SQLite (no copy of
the table).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trace_chunks", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("event_columns", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trace_chunks", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("event_columns")
