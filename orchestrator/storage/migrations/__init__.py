"""Alembic migration scripts for the result database (run through orchestrator.storage.db.open_db).

A package only so that env.py and the version scripts ship with the wheel; Alembic loads them by path.
"""
