"""What the tests share: seeding (seeding), waiting with a deadline (waiting), free ports
(ports), the server factory and the Gateway handle (servers), external services and private
instances of them (services), a settable wall clock (clocks), usage rows (usage), the real
engines (engines_real) and the vLLM stand-in as a process (standin_process). The stand-in
engines live in tests/standins; their in-process fixtures in tests/integration/conftest.py.

Test modules import from here (`from support import seed, start_gateway, wait_for`);
pyproject puts tests/ on the path, so the package is `support`."""

from laneway.embedded import EmbeddedServer as ServerThread

from support.clocks import Wall
from support.ports import free_port
from support.seeding import KeySpec, seed, sim_model
from support.servers import (
    EXE,
    Gateway,
    closed_by_server,
    in_process_settings,
    replica_pair,
    serve,
    start_gateway,
    stop_all,
)
from support.services import (
    IN_CI,
    PG_URL,
    REDIS_URL,
    PrivatePostgres,
    PrivateRedis,
    require_service,
    unavailable,
)
from support.standin_process import StandInProcess, stand_in_deployment, start_stand_ins
from support.usage import row_of, usage_rows
from support.waiting import until, wait_for

__all__ = [
    "EXE",
    "IN_CI",
    "PG_URL",
    "REDIS_URL",
    "Gateway",
    "KeySpec",
    "PrivatePostgres",
    "PrivateRedis",
    "ServerThread",
    "StandInProcess",
    "Wall",
    "closed_by_server",
    "free_port",
    "in_process_settings",
    "replica_pair",
    "require_service",
    "row_of",
    "seed",
    "serve",
    "sim_model",
    "stand_in_deployment",
    "start_gateway",
    "start_stand_ins",
    "stop_all",
    "unavailable",
    "until",
    "usage_rows",
    "wait_for",
]
