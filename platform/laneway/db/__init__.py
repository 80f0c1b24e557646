"""Storage: SQLAlchemy 2 async models, sessions and repositories (SQLite or PostgreSQL)."""
