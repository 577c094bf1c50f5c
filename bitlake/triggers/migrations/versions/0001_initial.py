"""events, flows and tokens

Revision ID: 0001
Revises:
Create Date: 2026-05-20
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copies of the types in bitlake/triggers/tables.py as of this revision.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("event_id", Id, primary_key=True, autoincrement=True),
        sa.Column("event_ts", sa.BigInteger(), nullable=False),
        sa.Column("table_name", sa.String(512), nullable=False),
        sa.Column("partition_json", sa.String(2048), nullable=False),
        sa.Column("snapshot_id", sa.String(128), nullable=False),
        sa.Column("snapshot_ts", sa.BigInteger(), nullable=True),
        sa.Column("prev_snapshot_id", sa.String(128), nullable=True),
        sa.Column("table_format", sa.String(16), nullable=False),
        sa.Column("operation_type", sa.String(16), nullable=False),
        sa.Column("tags", Json, nullable=False),
        sa.UniqueConstraint("table_name", "partition_json", "snapshot_id", name="uq_events_table_partition_snapshot"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_table_event_id", "events", ["table_name", "event_id"])
    op.create_index("ix_events_table_event_ts", "events", ["table_name", "event_ts"])
    op.create_table(
        "flows",
        sa.Column("flow_name", sa.String(200), primary_key=True),
        sa.Column("table_name", sa.String(512), primary_key=True),
        sa.Column("tags_json", sa.String(16384), nullable=False),
        sa.Column("start_ts", sa.BigInteger(), nullable=True),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("acked_at", sa.BigInteger(), nullable=True),
    )
    op.create_table(
        "tokens",
        sa.Column("token_id", Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("tables", Json, nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("revoked_at", sa.BigInteger(), nullable=True),
        sa.UniqueConstraint("token_hash", name="uq_tokens_token_hash"),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("tokens")
    op.drop_table("flows")
    op.drop_index("ix_events_table_event_ts", table_name="events")
    op.drop_index("ix_events_table_event_id", table_name="events")
    op.drop_table("events")
