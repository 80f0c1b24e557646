"""The Redis limiter's Lua scripts, shipped as `.lua` files beside this module and read once."""

from __future__ import annotations

from typing import Any

from laneway.core.redis_hub import LuaScript

RESERVE = LuaScript.packaged("laneway.core.ratelimit", "reserve")
SETTLE = LuaScript.packaged("laneway.core.ratelimit", "settle")
READ_COUNTERS = LuaScript.packaged("laneway.core.ratelimit", "read_counters")
SEED_COUNTER = LuaScript.packaged("laneway.core.ratelimit", "seed_counter")


def reply_epochs(reply: list[Any]) -> tuple[str, str]:
    """The counters' epochs in RESERVE's reply when it took the request."""
    first, second = (e.decode() if isinstance(e, bytes) else str(e) for e in reply[2:4])
    return first, second
