"""The route tester: the admin's first question, "where would this request go, and with what
limits?", answered without running it. A request is described (tenant, model, prompt length,
stream, task) or pasted as a body; the `route_planner` dependency decides it with the
pipeline's own code (runtime/route_preview.py), and admin/route_view.py says the answer: the
lane and the rule that matched, max_tokens and stops, the tenant's limits and remaining
quota, the replicas that could serve it and the one dispatch would pick now."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Controller, get, post
from litestar.di import NamedDependency
from litestar.response import Template
from sqlalchemy import select

from laneway.admin.dependencies import Limiter, Planner, Registry, Routing
from laneway.admin.forms import form_of
from laneway.admin.guards import AdminRequest, NotLoggedIn
from laneway.admin.limits import tenant_usage
from laneway.admin.route_view import lanes_tried, limits_said, max_tokens_said, replicas_said
from laneway.admin.service import AdminService
from laneway.admin.ui import Page, to_login
from laneway.admin.validation import INT32_MAX
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.db.models import Tenant
from laneway.db.repositories import PolicyRepository
from laneway.types import TenantSnapshot

MAX_PROMPT_WORDS = 1_000_000  # a described prompt is built in memory: bounded


def snapshot_of(t: Tenant) -> TenantSnapshot:
    """The tenant as a request with a key of its own would see it (no key limits)."""
    return TenantSnapshot(
        id=t.id,
        name=t.name,
        api_key_id=0,
        weight=t.weight,
        rpm=t.rpm,
        tpm=t.tpm,
        max_concurrency=t.max_concurrency,
        disabled=t.disabled,
        allowed_models=frozenset(t.allowed_models) if t.allowed_models is not None else None,
        allowed_lanes=frozenset(t.allowed_lanes or ()),
        priority_floor=t.priority_floor,
        min_ttft_target_ms=t.min_ttft_target_ms,
        tokens_per_day=t.tokens_per_day,
        tokens_per_month=t.tokens_per_month,
    )


def described_body(form: dict[str, str]) -> tuple[str, bytes]:
    """(endpoint, body) of a described request: a user message of N words ("the the ..."), as
    a client would send it."""
    try:
        words = min(max(int(form.get("prompt_tokens") or "1"), 1), MAX_PROMPT_WORDS)
    except ValueError:
        words = 1
    text = " ".join(["the"] * words)
    named = form.get("endpoint", "")
    endpoint = named if named in ("completions", "messages") else "chat"
    body: dict[str, Any] = {"model": form.get("model", "")}
    body |= {"prompt": text} if endpoint == "completions" else {"messages": [{"role": "user", "content": text}]}
    if form.get("stream") == "true":
        body["stream"] = True
    asked = form.get("max_tokens", "").strip()
    if asked:
        body["max_tokens"] = int(asked) if asked.isdigit() else asked  # not a number: the API's refusal
    return endpoint, msgspec.json.encode(body)


class RoutePages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    async def _choices(self, svc: AdminService, registry: Registry) -> dict[str, Any]:
        async with svc.sessions() as session:
            tenants = list((await session.execute(select(Tenant.name).order_by(Tenant.name).limit(500))).scalars())
            repo = PolicyRepository(session)
            lanes = [x.name for x in await repo.lanes()]
            tasks = [t.task for t in await repo.task_policies()]
        return {"tenants": tenants, "models": registry.aliases(), "lanes": lanes, "tasks": tasks}

    @get("/route")
    async def route_page(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], registry: Registry
    ) -> Page:
        choices = await self._choices(admin_service, registry)
        params = request.query_params
        typed = {
            "model": params.get("model") or next(iter(choices["models"]), ""),
            "tenant": params.get("tenant") or next(iter(choices["tenants"]), ""),
            "prompt_tokens": "200",
            "mode": "shape",
        }
        context = {"admin": request.user.username, "csrf": request.user.csrf, "typed": typed, **choices}
        return Template("route.html", context=context)

    @post("/route")
    async def route(
        self,
        request: AdminRequest,
        admin_service: NamedDependency[AdminService],
        registry: Registry,
        routing_figures: Routing,
        route_planner: Planner,
        limiter: Limiter,
    ) -> Page:
        form = await form_of(request)
        choices = await self._choices(admin_service, registry)
        context: dict[str, Any] = {"admin": request.user.username, "csrf": request.user.csrf, "typed": form, **choices}
        async with admin_service.sessions() as session:
            name = form.get("tenant", "").strip()
            row = (await session.execute(select(Tenant).where(Tenant.name == name))).scalar_one_or_none()
            usage = await tenant_usage(limiter, session, row) if row is not None else None
        if row is None:
            context["refusal"] = {"status": 400, "code": "-", "message": f"There is no tenant named '{name}'."}
            return Template("route.html", context=context, status_code=400)
        tenant = snapshot_of(row)
        if form.get("mode") == "body":
            endpoint, body = form.get("endpoint", "chat"), form.get("body", "").encode()
        else:
            endpoint, body = described_body(form)
        headers = {
            k: form[f"header_{k}"].strip()
            for k in ("x-laneway-task", "x-laneway-lane")
            if form.get(f"header_{k}", "").strip()
        }
        context |= {"tenant": tenant, "usage": usage, "sent": body.decode(), "endpoint": endpoint, "headers": headers}
        if tenant.disabled:
            context["refusal"] = {
                "status": ErrorCode.TENANT_DISABLED.status,
                "code": ErrorCode.TENANT_DISABLED.value,
                "message": f"Tenant '{tenant.name}' is disabled: its keys are refused before anything is routed.",
            }
            return Template("route.html", context=context)
        try:
            plan = await route_planner(tenant, endpoint, body, headers)
        except GatewayError as exc:  # what laneway would answer instead
            context["refusal"] = {
                "status": exc.status,
                "code": exc.code.value,
                "message": exc.message,
                "param": exc.param,
            }
            return Template("route.html", context=context)
        lanes, why = lanes_tried(plan)
        context |= {
            "plan": plan,
            "call": plan.call,
            "lanes_tried": lanes,
            "lane_why": why,
            "max_tokens_why": max_tokens_said(plan),
            "limits": limits_said(plan, tenant),
            "replicas": replicas_said(plan, registry, routing_figures),
            "int32_max": INT32_MAX,
        }
        return Template("route.html", context=context)
