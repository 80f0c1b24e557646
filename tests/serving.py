"""bench/'s import path for the test helpers (the benches put tests/ on sys.path and import
`serving`); the tests themselves import `support`. Goes once bench/ imports `support`."""

from support import ServerThread, closed_by_server, free_port, seed, serve, sim_model

__all__ = ["ServerThread", "closed_by_server", "free_port", "seed", "serve", "sim_model"]
