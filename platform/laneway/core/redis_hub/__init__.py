"""laneway's one Redis edge: a pipelined connection of its own, public APIs only (hub.py)."""

from laneway.core.redis_hub.address import RedisAddress, parse_redis_url
from laneway.core.redis_hub.hub import RedisHub
from laneway.core.redis_hub.script import LuaScript

__all__ = ["LuaScript", "RedisAddress", "RedisHub", "parse_redis_url"]
