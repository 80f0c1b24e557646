"""Which of an alias's pools a request goes to: the canary's, with its weight, else the serving one.

The choice is a stable hash of the tenant and the request's session: its `prompt_cache_key`,
else its `user`, else the conversation's first user message (the first message when none is
the user's; a completion's prompt head). Every turn of one conversation, on every gateway
replica, lands in the same pool, so a conversation stays on one engine and its prefix cache
stays warm. The first user message rather than the first message: most chats open with the
same system prompt, which would send every conversation of an app to one pool.

Inside the pool the cache- and load-aware picker is unchanged (core/dispatch/picker.py): the
pool only narrows its candidates (registry.in_pool).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from laneway.engines.registry import LiveDeployment
from laneway.types import ChatTurn

SERVING = "serving"
CANARY = "canary"
SHADOW = "shadow"
ROLES = (SERVING, CANARY, SHADOW)
HEAD_BYTES = 512  # of a first message: enough to tell conversations apart, bounded to hash


class Sessioned(Protocol):
    @property
    def prompt_cache_key(self) -> str | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def prompt(self) -> str | None: ...
    @property
    def messages(self) -> Sequence[ChatTurn] | None: ...


def session_of(intent: Sessioned) -> str:
    """What names the request's conversation (see the module's note)."""
    if intent.prompt_cache_key:
        return "key\0" + intent.prompt_cache_key
    if intent.user:
        return "user\0" + intent.user
    messages = intent.messages
    if messages:
        first = next((m for m in messages if m.role == "user"), messages[0])
        return "first\0" + first.content[:HEAD_BYTES]
    return "prompt\0" + (intent.prompt or "")[:HEAD_BYTES]


def share_of(tenant_id: int, session: str) -> float:
    """The session's place in [0, 100): the same on every gateway replica, for every turn."""
    digest = hashlib.blake2b(f"{tenant_id}\0{session}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") * 100.0 / 2**64


def canary_weight(replicas: Sequence[LiveDeployment]) -> float:
    """The percent of the alias's sessions its canaries take (their weights summed, at most
    100). A canary ejected for errors or draining takes none meanwhile: its sessions go to the
    serving pool, not to the alias's fallbacks (which an unhealthy replica would choose)."""
    live = [d for d in replicas if d.role == CANARY and d.weight > 0 and d.healthy and not d.draining]
    return min(100.0, sum(d.weight for d in live))


def choose_pool(replicas: Sequence[LiveDeployment], tenant_id: int, session: str) -> str:
    """ "canary" for the sessions that fall inside the canaries' weight, else "serving"."""
    weight = canary_weight(replicas)
    if weight <= 0:
        return SERVING
    return CANARY if share_of(tenant_id, session) < weight else SERVING


def shadow_of(replicas: Sequence[LiveDeployment]) -> LiveDeployment | None:
    """The alias's shadow deployment sampling live requests, if it has one."""
    return next((d for d in replicas if d.role == SHADOW and d.sample > 0), None)
