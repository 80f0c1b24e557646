"""Admin operations on lanes and task policies: create or update one (PUT sets exactly the
fields sent), audited, and applied to the next request through the policy snapshot."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from laneway.admin.service import AdminService, cannot_clear, row
from laneway.admin.validation import MAX_REPETITION_NGRAM, Int32, LaneName, Positive, check_text
from laneway.db.models import Lane, TaskPolicy
from laneway.db.repositories import AuditRepository, PolicyRepository


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
    "name", "position", "priority", "match_max_prompt_tokens", "match_stream", "match_tasks", "max_queue_depth",
    "queue_timeout_s", "max_concurrency", "max_unacked_tokens", "retry_after_s",
)  # fmt: skip
TASK_FIELDS = ("task", "max_tokens", "long_prompt_tokens", "long_prompt_max_tokens", "stop", "repetition_ngram",
               "repetition_count", "json_stop")  # fmt: skip

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


async def put_lane(svc: AdminService, actor: str, name: str, data: LaneIn, sent: set[str]) -> dict[str, Any]:
    check_text("name", name, max_length=60)
    return await _put_policy(svc, actor, "lane", Lane, LANE_FIELDS, name, data, sent)


async def put_task(svc: AdminService, actor: str, task: str, data: TaskIn, sent: set[str]) -> dict[str, Any]:
    check_text("task", task, max_length=60)
    return await _put_policy(svc, actor, "task", TaskPolicy, TASK_FIELDS, task, data, sent)


async def _put_policy(
    svc: AdminService,
    actor: str,
    entity: str,
    model: type[Any],
    fields: tuple[str, ...],
    key: str,
    data: Struct,
    sent: set[str],
) -> dict[str, Any]:
    """Create or update a lane or task policy, audit it, and apply it to the next request."""
    values = _put_fields(model, data, sent)
    async with svc.sessions() as session, session.begin():
        repo = PolicyRepository(session)
        existing = await repo.find(model, key)
        before = row(existing, fields) if existing else None
        after = row(await repo.upsert(model, key, **values), fields)
        await AuditRepository(session).add(actor, "update" if before else "create", entity, key, before, after)
    await svc.reload_policies()  # the next request routes by it
    await svc.config_changes.notify()
    return after
