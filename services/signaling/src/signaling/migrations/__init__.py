"""Alembic migrations of the flows database, run only by `signaling-migrate`."""
