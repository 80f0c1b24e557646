"""The admin route tester's planner: a request body read as the API reads it (api/request.py:
the same decoding, checks and headers), then the Gateway's dry run of it (its own prepare:
resolve, measure, policy, lane, a fallback alias when the alias has no healthy replica; and,
for an alias that binds late, the replica dispatch would pick now). Nothing is taken or
recorded: no rate limit, no admission, no queue, no prefix index. Composed here, where the
API and the pipeline may both be reached (the admin pages get it through the `route_planner`
dependency)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from laneway.admin.dependencies import RoutePlan
from laneway.api import protocol as p
from laneway.api.messages import protocol as mp
from laneway.api.messages.translate import message_intent
from laneway.api.request import chat_intent, completion_intent, decode
from laneway.contracts.errors import invalid_request
from laneway.core.pipeline import Gateway
from laneway.types import TenantSnapshot


class _Body:
    """An API request that is only its body and headers (api/request.py's Incoming)."""

    def __init__(self, body: bytes, headers: Mapping[str, str]) -> None:
        self._body = body
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.scope: dict[str, Any] = {}

    @property
    def receive(self) -> Callable[[], Awaitable[Any]]:
        raise NotImplementedError("a planned request is never read from a connection")

    async def body(self) -> bytes:
        return self._body


class RoutePlanner:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def __call__(
        self, tenant: TenantSnapshot, endpoint: str, body: bytes, headers: Mapping[str, str]
    ) -> RoutePlan:
        request = _Body(body, headers)
        if endpoint == "chat":
            intent = chat_intent(request, await decode(request, p.ChatCompletionRequest))
        elif endpoint == "completions":
            intent = completion_intent(request, await decode(request, p.CompletionRequest))
        elif endpoint == "messages":  # Anthropic's: max_tokens is required there, as the API says
            intent = message_intent(request, await decode(request, mp.MessagesRequest))
        else:
            raise invalid_request(f"Unknown endpoint '{endpoint}' (chat, completions or messages).", param="endpoint")
        gateway = self.gateway
        run = await gateway.dry_run(tenant, intent)
        return RoutePlan(
            call=run.call,
            policies=gateway.policies.current,
            requested_max_tokens=intent.max_tokens,
            default_max_tokens=gateway.default_max_tokens,
            replicas=run.replicas,
            pick=run.pick,
            explicit_lane=intent.lane,
        )
