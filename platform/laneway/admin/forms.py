"""The admin pages' form strings read into the admin operations' validated inputs (the same
Structs the JSON API decodes): empty inputs clear a field, comma lists are split."""

from __future__ import annotations

from typing import Any

from litestar import Request

from laneway.admin.limits import KEY_LIMIT_FIELDS
from laneway.admin.tenants import TenantIn
from laneway.admin.validation import convert


async def form_of(request: Request) -> dict[str, str]:  # type: ignore[type-arg]
    return {k: str(v) for k, v in (await request.form()).items()}


def tenant_input(form: dict[str, str]) -> tuple[TenantIn, set[str]]:
    """Form strings -> a validated TenantIn: empty number fields clear the limit, comma lists
    (allowed models, allowed lanes) clear when empty, an empty priority floor is 0."""
    raw: dict[str, Any] = {}
    numbers = ("weight", "rpm", "tpm", "max_concurrency", "priority_floor", "min_ttft_target_ms")
    for field in (*numbers, "tokens_per_day", "tokens_per_month"):
        if field in form:
            text = form[field].strip()
            raw[field] = (0 if field == "priority_floor" else None) if text == "" else text
    if "name" in form:
        raw["name"] = form["name"].strip()
    for field in ("allowed_models", "allowed_lanes"):
        if field in form:
            raw[field] = [m.strip() for m in form[field].split(",") if m.strip()] or None
    if "csrf_token" in form and "name" not in form:  # the edit form: an unticked box is "not disabled"
        raw["disabled"] = form.get("disabled") == "true"
    return convert(raw, TenantIn, strict=False), set(raw)


def key_limits_input(form: dict[str, str]) -> dict[str, Any]:
    """The key-limit inputs of a form: an empty number clears the limit, the model list is
    comma separated (empty: every model the tenant may use)."""
    raw: dict[str, Any] = {}
    for field in KEY_LIMIT_FIELDS:
        if field not in form:
            continue
        text = form[field].strip()
        if field == "allowed_models":
            raw[field] = [m.strip() for m in text.split(",") if m.strip()] or None
        else:
            raw[field] = text or None
    return raw


def page_number(raw: str | None) -> int:
    """The HTML list clamps a page it cannot show (a stale or hand-edited link) to the first."""
    try:
        return max(1, int(raw or "1"))
    except ValueError:
        return 1


async def form_lists(request: Request, *names: str) -> dict[str, list[str]]:  # type: ignore[type-arg]
    """The inputs sent several times under one name (a list edited as one box per item)."""
    form = await request.form()
    return {name: [str(v) for v in form.getall(name)] for name in names if name in form}


def policy_input(
    form: dict[str, str], kind: type[Any], lists: dict[str, list[str]] | None = None
) -> tuple[Any, set[str]]:
    """Form strings -> a validated LaneIn/TaskIn and the fields the form sent (the policy form
    sends every field): numbers, true/false, comma lists, or a list sent as one input per item
    (`lists`: empty items dropped, the others kept as typed); an empty input clears the field
    (refused for one that must have a value)."""
    raw: dict[str, Any] = {}
    for field in kind.__struct_fields__:
        if lists and field in lists:
            raw[field] = [x for x in lists[field] if x != ""] or None
            continue
        if field not in form:
            continue
        text = form[field].strip()
        if text == "":
            raw[field] = None
        elif field == "match_tasks":
            raw[field] = [x.strip() for x in text.split(",") if x.strip()]
        elif field == "stop":
            raw[field] = [x for x in text.split(",") if x]
        else:
            raw[field] = text
    if "background" in kind.__struct_fields__ and "csrf_token" in form and "name" not in form:
        raw["background"] = form.get("background") == "true"  # the edit form: an unticked box is "not background"
    return convert(raw, kind, strict=False), set(raw)
