"""The shared slots' Lua scripts, shipped as `.lua` files beside this module and read once:
each begins with common.lua's helpers."""

from __future__ import annotations

from laneway.core.redis_hub import LuaScript

_PACKAGE = "laneway.core.shared_slots"
ENQUEUE = LuaScript.packaged(_PACKAGE, "common", "enqueue")
LEAVE = LuaScript.packaged(_PACKAGE, "common", "leave")
HEARTBEAT = LuaScript.packaged(_PACKAGE, "common", "heartbeat")
