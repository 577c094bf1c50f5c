"""Alembic environment of the trigger store: run by :func:`bitlake.triggers.database.run_migrations` on a
connection it passes in ``config.attributes["connection"]`` (there is no alembic.ini)."""

from alembic import context

from bitlake.triggers.tables import VERSION_TABLE, Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    # SQLite alters a table by copying it; batch mode lets later migrations be written once for both.
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
