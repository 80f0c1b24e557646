"""bench/'s import path for the private Redis and PostgreSQL (the benches put tests/ on
sys.path and import `services`); the tests themselves import `support`. Goes once bench/
imports `support`."""

from support import PrivatePostgres, PrivateRedis

__all__ = ["PrivatePostgres", "PrivateRedis"]
