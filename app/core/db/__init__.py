"""Database tables and session handling (SQLAlchemy 2)."""
