"""Admin operation on a model alias's fallbacks: the ordered aliases that serve its requests
when it cannot (no healthy replica, or a queue that would refuse). Validated at save (each
one a known alias, none twice, no loop), audited, applied to this replica's policy snapshot
at once and announced to the others by NOTIFY."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from msgspec import Meta, Struct

from laneway.admin.service import AdminService
from laneway.admin.validation import ModelAlias, check_text
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import AuditRepository, ModelRepository

MAX_FALLBACKS = 16  # more than anyone tries in one request; bounds the loop check's walk


class FallbacksIn(Struct, forbid_unknown_fields=True):
    fallbacks: Annotated[list[ModelAlias], Meta(max_length=MAX_FALLBACKS)]


def split_aliases(text: str) -> list[str]:
    """A comma-separated list as typed in a form or on the command line ("" or "none": none)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    return [] if [x.lower() for x in items] == ["none"] else items


def chain(graph: Mapping[str, Sequence[str]], start: str, goal: str) -> list[str] | None:
    """A chain of fallbacks from `start` to `goal` (both included), or None when there is none."""
    seen: set[str] = set()
    stack = [[start]]
    while stack:
        path = stack.pop()
        if path[-1] == goal:
            return path
        if path[-1] in seen:
            continue
        seen.add(path[-1])
        stack.extend([*path, nxt] for nxt in reversed(graph.get(path[-1], ())))
    return None


def check_fallbacks(graph: Mapping[str, Sequence[str]], alias: str, fallbacks: Sequence[str]) -> None:
    """400 naming `fallbacks[i]` for an unknown alias, one given twice, or a loop the new list
    would close (an alias falling back to itself included)."""
    for i, fallback in enumerate(fallbacks):
        param = f"fallbacks[{i}]"
        if fallback == alias:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST, f"The model '{alias}' cannot fall back to itself.", param=param
            )
        if fallback not in graph:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST, f"There is no model alias '{fallback}' to fall back to.", param=param
            )
        if fallback in fallbacks[:i]:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"The fallback '{fallback}' is listed twice.", param=param)
    # The saved lists are loop-free, so a loop the new list makes runs through `alias`.
    changed = {**graph, alias: list(fallbacks)}
    for i, fallback in enumerate(fallbacks):
        back = chain(changed, fallback, alias)
        if back is not None:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"The fallbacks of '{alias}' would make a loop: {' -> '.join([alias, *back])}.",
                param=f"fallbacks[{i}]",
            )


async def get_fallbacks(svc: AdminService, alias: str) -> dict[str, Any]:
    check_text("alias", alias, max_length=200)
    async with svc.sessions() as session:
        graph = await ModelRepository(session).fallback_graph()
    if alias not in graph:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No model alias '{alias}'.", param="alias")
    return {"alias": alias, "fallbacks": graph[alias]}


async def set_fallbacks(svc: AdminService, actor: str, alias: str, data: FallbacksIn) -> dict[str, Any]:
    """Give `alias` these fallbacks (an empty list: none). The check and the write are one
    transaction over the locked rows: two concurrent edits cannot each add half of a loop."""
    check_text("alias", alias, max_length=200)
    async with svc.sessions() as session, session.begin():
        repo = ModelRepository(session)
        graph = await repo.fallback_graph(lock=True)
        if alias not in graph:
            raise GatewayError(ErrorCode.NOT_FOUND, f"No model alias '{alias}'.", param="alias")
        check_fallbacks(graph, alias, data.fallbacks)
        before = graph[alias]
        if before != data.fallbacks:
            await repo.set_fallbacks(alias, data.fallbacks)
            await AuditRepository(session).add(
                actor, "update", "model", alias, {"fallbacks": before}, {"fallbacks": data.fallbacks}
            )
    await svc.reload_policies()
    await svc.config_changes.notify()
    return {"alias": alias, "fallbacks": data.fallbacks}
