"""Alembic migrations for vramlab's database (SQLite and PostgreSQL)."""
