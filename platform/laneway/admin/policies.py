"""Admin operations on lanes and task policies: create or update one (PUT sets exactly the
fields sent), add one that must be new, delete one, put the lanes in a new order; each
audited, and applied to the next request through the policy snapshot (other replicas: NOTIFY)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from msgspec import Meta, Struct

from laneway.admin.service import AdminService, cannot_clear, row
from laneway.admin.validation import MAX_REPETITION_NGRAM, Int32, LaneName, Positive, check_text
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.slo import MAX_TPOT_TARGET_MS, MAX_TTFT_TARGET_MS
from laneway.db.models import Lane, TaskPolicy
from laneway.db.repositories import AuditRepository, ModelRepository, PolicyRepository


class LaneIn(Struct, omit_defaults=True, forbid_unknown_fields=True):
    position: Int32 | None = None
    priority: Int32 | None = None
    match_max_prompt_tokens: Positive | None = None
    match_stream: bool | None = None
    match_tasks: Annotated[list[LaneName], Meta(max_length=100)] | None = None
    max_queue_depth: Positive | None = None
    queue_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] | None = None
    max_concurrency: Positive | None = None
    max_unacked_tokens: Positive | None = None
    retry_after_s: Annotated[int, Meta(ge=1, le=86_400)] | None = None
    background: bool | None = None
    # Latency objectives in ms (core/slo.py); null: no target. TTFT within the queue timeout.
    ttft_target_ms: Annotated[int, Meta(ge=1, le=MAX_TTFT_TARGET_MS)] | None = None
    tpot_target_ms: Annotated[int, Meta(ge=1, le=MAX_TPOT_TARGET_MS)] | None = None


class TaskIn(Struct, omit_defaults=True, forbid_unknown_fields=True):
    max_tokens: Positive | None = None
    long_prompt_tokens: Positive | None = None
    long_prompt_max_tokens: Positive | None = None
    stop: Annotated[list[Annotated[str, Meta(min_length=1, max_length=200)]], Meta(max_length=16)] | None = None
    # Early stops (core/early_stops.py): null n-gram turns the repetition rule off.
    repetition_ngram: Annotated[int, Meta(ge=1, le=MAX_REPETITION_NGRAM)] | None = None
    repetition_count: Annotated[int, Meta(ge=2, le=1000)] | None = None
    json_stop: bool | None = None


LANE_FIELDS = (
    "name",
    "position",
    "priority",
    "match_max_prompt_tokens",
    "match_stream",
    "match_tasks",
    "max_queue_depth",
    "queue_timeout_s",
    "max_concurrency",
    "max_unacked_tokens",
    "retry_after_s",
    "background",
    "ttft_target_ms",
    "tpot_target_ms",
)
TASK_FIELDS = (
    "task",
    "max_tokens",
    "long_prompt_tokens",
    "long_prompt_max_tokens",
    "stop",
    "repetition_ngram",
    "repetition_count",
    "json_stop",
)


class LaneOrderIn(Struct, forbid_unknown_fields=True):
    """Every lane's name, in the order their rules are to be tried."""

    order: Annotated[list[LaneName], Meta(max_length=1000)]


# A policy field that is a list clears to [] where its column holds no null.
_CLEARED_TO: dict[str, Any] = {"stop": []}


def _put_fields(model: type[Any], data: Struct, sent: set[str]) -> dict[str, Any]:
    """PUT sets exactly the fields sent: the others keep their value (a new row: the column
    default). An explicit null clears a nullable field (a lane rule then matches anything)
    and is refused for a field that must have a value."""
    columns = model.__table__.c
    out: dict[str, Any] = {}
    for field in sorted(sent & set(data.__struct_fields__)):
        value = getattr(data, field)
        if value is None:
            if field in _CLEARED_TO:
                value = list(_CLEARED_TO[field])
            elif not columns[field].nullable:
                raise cannot_clear(field)
        out[field] = value
    return out


async def put_lane(
    svc: AdminService, actor: str, name: str, data: LaneIn, sent: set[str], *, new: bool = False
) -> dict[str, Any]:
    """Create or update the lane. `new` (the add form): refuse a name that exists, and put the
    lane last unless a position is given (its rule is tried after every other's until moved up)."""
    check_text("name", name, max_length=60)
    return await _put_policy(svc, actor, "lane", Lane, LANE_FIELDS, name, data, sent, new=new)


async def put_task(
    svc: AdminService, actor: str, task: str, data: TaskIn, sent: set[str], *, new: bool = False
) -> dict[str, Any]:
    check_text("task", task, max_length=60)
    return await _put_policy(svc, actor, "task", TaskPolicy, TASK_FIELDS, task, data, sent, new=new)


async def delete_lane(svc: AdminService, actor: str, name: str) -> dict[str, Any]:
    """Delete a lane; refused (409, nothing changed) while a deployment is dedicated to it (its
    config lists the lane): that deployment would lose the traffic it is kept for."""
    check_text("name", name, max_length=60)
    async with svc.sessions() as session, session.begin():
        repo = PolicyRepository(session)
        lane = await repo.find(Lane, name)
        if lane is None:
            raise GatewayError(ErrorCode.NOT_FOUND, f"No lane named '{name}'.", param="name")
        dedicated = await ModelRepository(session).dedicated_to(name)
        if dedicated:
            which = ", ".join(f"'{d}' ({alias})" for alias, d in dedicated)
            raise GatewayError(
                ErrorCode.CONFLICT,
                f"The lane '{name}' cannot be deleted: deployment {which} is "
                "dedicated to it. Take the lane out of that deployment's lanes first.",
                param="name",
            )
        before = row(lane, LANE_FIELDS)
        await repo.delete(Lane, name)
        await AuditRepository(session).add(actor, "delete", "lane", name, before, None)
    await _applied(svc)
    return before


async def delete_task(svc: AdminService, actor: str, task: str) -> dict[str, Any]:
    """Delete a task policy: its requests then get the default max_tokens and no task stops."""
    check_text("task", task, max_length=60)
    async with svc.sessions() as session, session.begin():
        repo = PolicyRepository(session)
        found = await repo.find(TaskPolicy, task)
        if found is None:
            raise GatewayError(ErrorCode.NOT_FOUND, f"No task policy for '{task}'.", param="task")
        before = row(found, TASK_FIELDS)
        await repo.delete(TaskPolicy, task)
        await AuditRepository(session).add(actor, "delete", "task", task, before, None)
    await _applied(svc)
    return before


async def set_lane_order(svc: AdminService, actor: str, data: LaneOrderIn) -> list[str]:
    """Try the lanes' rules in this order: every lane named once. One transaction over the
    locked rows, so a request never sees half a reorder and two reorders cannot interleave."""

    def reorder(names: list[str]) -> list[str]:
        if sorted(data.order) != sorted(names) or len(set(data.order)) != len(data.order):
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"order must name every lane once (the lanes are: {', '.join(names) or 'none'}).",
                param="order",
            )
        return list(data.order)

    return await _reorder(svc, actor, reorder)


async def move_lane(svc: AdminService, actor: str, name: str, step: int) -> list[str]:
    """Move a lane one place up (step -1: its rule is tried earlier) or down (+1)."""
    check_text("name", name, max_length=60)

    def reorder(names: list[str]) -> list[str]:
        if name not in names:
            raise GatewayError(ErrorCode.NOT_FOUND, f"No lane named '{name}'.", param="name")
        i = names.index(name)
        j = min(max(i + step, 0), len(names) - 1)
        names[i], names[j] = names[j], names[i]
        return names

    return await _reorder(svc, actor, reorder)


async def _reorder(svc: AdminService, actor: str, reorder: Callable[[list[str]], list[str]]) -> list[str]:
    async with svc.sessions() as session, session.begin():
        lanes = await PolicyRepository(session).lanes(lock=True)
        before = [lane.name for lane in lanes]
        after = reorder(list(before))
        positions = {lane.name: lane.position for lane in lanes}
        wanted = {name: i for i, name in enumerate(after)}
        if after == before and positions == wanted:
            return after
        for lane in lanes:
            lane.position = wanted[lane.name]
        await session.flush()
        await AuditRepository(session).add(actor, "reorder", "lanes", "order", {"order": before}, {"order": after})
    await _applied(svc)
    return after


async def _applied(svc: AdminService) -> None:
    await svc.reload_policies()  # the next request routes by it
    await svc.config_changes.notify()


async def _put_policy(
    svc: AdminService,
    actor: str,
    entity: str,
    model: type[Any],
    fields: tuple[str, ...],
    key: str,
    data: Struct,
    sent: set[str],
    *,
    new: bool = False,
) -> dict[str, Any]:
    """Create or update a lane or task policy, audit it, and apply it to the next request."""
    values = _put_fields(model, data, sent)
    async with svc.sessions() as session, session.begin():
        repo = PolicyRepository(session)
        existing = await repo.find(model, key)
        if existing is not None and new:
            param = "name" if model is Lane else "task"
            raise GatewayError(ErrorCode.CONFLICT, f"There is already a {entity} named '{key}'.", param=param)
        if new and model is Lane and "position" not in values:
            values["position"] = max((x.position for x in await repo.lanes()), default=-1) + 1
        before = row(existing, fields) if existing else None
        if model is Lane:
            _check_ttft_within_timeout(existing, values, sent)
        after = row(await repo.upsert(model, key, **values), fields)
        await AuditRepository(session).add(actor, "update" if before else "create", entity, key, before, after)
    await _applied(svc)
    return after


def _check_ttft_within_timeout(lane: Lane | None, values: dict[str, Any], sent: set[str]) -> None:
    """A TTFT target past the lane's queue timeout (its hard bound) promises nothing: a request
    is refused before it could miss it. Refused, naming the field sent (the target, else the
    timeout), with what both would be after the change."""
    column_default = Lane.__table__.c.queue_timeout_s.default
    timeout = values.get("queue_timeout_s", lane.queue_timeout_s if lane else column_default.arg)
    target = values.get("ttft_target_ms", lane.ttft_target_ms if lane else None)
    if target is None or target <= timeout * 1000:
        return
    field = "ttft_target_ms" if "ttft_target_ms" in sent else "queue_timeout_s"
    raise GatewayError(
        ErrorCode.INVALID_REQUEST,
        f"ttft_target_ms ({target} ms) must be at most the queue timeout ({timeout:g} s = {timeout * 1000:g} ms): "
        "the timeout is the lane's hard bound. Raise queue_timeout_s or lower the target.",
        param=field,
    )
